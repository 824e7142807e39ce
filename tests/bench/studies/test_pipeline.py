"""bench.studies.pipeline's arithmetic: runs pooled, one off baseline per workload, the speedup kept at the largest delay."""

import pytest

from bench.studies.pipeline import paired, pooled, row, summary, turns


def run(tokens: int, seconds: float, rounds: int, drafts: int = 0, ahead_used: int = 0) -> dict:
    return {"seconds": seconds, "tokens": tokens, "rounds": rounds, "drafts": drafts, "draft_tokens": 4 * drafts,
            "accepted": 2 * drafts, "fallback": 0, "ahead_used": ahead_used, "ahead_discarded": 0,
            "wall": seconds}


def test_runs_pool_their_counts_and_times():
    total = pooled([run(10, 1.0, 10), run(30, 2.0, 20)])
    assert total["tokens"] == 40 and total["seconds"] == 3.0 and total["rounds"] == 30


def test_speedups_at_every_delay_are_against_the_one_pooled_off():
    off = pooled([run(10, 1.0, 10), run(10, 1.5, 10), run(10, 1.1, 10)])  # off at 0, 5 and 20 ms: drift only
    fast = row(0.0, "copy", "pipelined", run(20, 1.0, 8, drafts=6, ahead_used=3), off, concurrency=1)
    slow = row(20.0, "copy", "pipelined", run(20, 1.2, 8, drafts=6, ahead_used=1), off, concurrency=1)
    assert fast["speedup"] == pytest.approx(20 / (30 / 3.6), abs=1e-3)
    assert fast["hit_rate"] == 0.5 and slow["hit_rate"] == pytest.approx(0.167, abs=1e-3)
    kept = summary([fast, slow])["copy/pipelined"]["kept"]
    assert kept == pytest.approx(1.0 / 1.2, abs=1e-3)  # the same baseline cancels: a ratio of tokens/s


def test_one_stream_takes_turns_per_prompt_and_several_per_batch():
    batch = [([1], 8), ([2], 8), ([3], 8)]
    assert turns(batch, concurrency=1) == [[([1], 8)], [([2], 8)], [([3], 8)]]
    assert turns(batch, concurrency=8) == [batch]


def test_paired_speedup_is_the_geometric_mean_of_turns_with_an_interval_around_it():
    """Turns at 0.8x and 1.25x of off average to 1.0x (a ratio's mean is geometric); the interval holds it."""
    steady = paired([0.8, 1.25] * 10)
    assert steady["paired_speedup"] == pytest.approx(1.0, abs=1e-3) and steady["turns"] == 20
    assert steady["paired_low"] < 1.0 < steady["paired_high"]
    assert paired([1.1] * 5) == {"paired_speedup": 1.1, "paired_low": 1.1, "paired_high": 1.1, "turns": 5}
    assert paired([])["paired_speedup"] is None


def test_each_mode_is_paired_with_off_on_its_own_verifier_process(monkeypatch):
    """The pipelined verifier's process runs everything 1.25x slower here, off included: pipelined is paired with
    off on that process (1.0x), not with off on the serial verifier's (0.8x); off@pipelined shows the 0.8x."""
    import types

    from bench.studies import pipeline

    slow = {"off": 1.0, "serial": 1.0, "pipelined": 1.25, "off@pipelined": 1.25}
    monkeypatch.setattr(pipeline, "run_as", lambda mode, verifiers, batch, concurrency:
                        run(10 * len(batch), slow[mode] * len(batch), 10 * len(batch)))
    args = types.SimpleNamespace(delays="0,20", repeats=2, concurrency=1)
    rows = pipeline.sweep(args, types.SimpleNamespace(delay_ms=0.0), {}, {"copy": [([1], 8), ([2], 8)]})
    by = {(r["rtt_ms"], r["mode"]): r for r in rows}
    assert by[(20.0, "pipelined")]["paired_speedup"] == pytest.approx(1.0)
    assert by[(20.0, "pipelined")]["speedup"] == pytest.approx(1.0)
    assert by[(0.0, "serial")]["paired_speedup"] == pytest.approx(1.0)
    assert by[(0.0, "off@pipelined")]["paired_speedup"] == pytest.approx(0.8)
    assert by[(0.0, "pipelined")]["turns"] == 4  # 2 prompts x 2 repeats, each its own turn


def test_the_plot_draws_the_paired_speedup_the_tables_report(tmp_path):
    """The plot's points are the paired speedups with their intervals (the tables' figures), not the pooled ones."""
    from bench.studies.pipeline import curve, plot

    rows = [{"rtt_ms": 20.0, "workload": "copy", "mode": "pipelined", "speedup": 0.90, "round_ms": 190.0,
             "paired_speedup": 0.95, "paired_low": 0.91, "paired_high": 0.99},
            {"rtt_ms": 0.0, "workload": "copy", "mode": "pipelined", "speedup": 1.00, "round_ms": 160.0,
             "paired_speedup": None, "paired_low": None, "paired_high": None}]
    points = curve(rows, "copy", "pipelined")
    assert points == {"rtt_ms": [0.0, 20.0], "speedup": [1.00, 0.95], "low": [1.00, 0.91], "high": [1.00, 0.99],
                      "round_ms": [160.0, 190.0]}
    plot(rows + [dict(r, mode="serial") for r in rows] + [dict(r, mode="off") for r in rows], "t", tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0
