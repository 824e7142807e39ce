"""bench.pipeline's arithmetic: runs pooled, one off baseline per workload, the speedup kept at the largest delay."""

import pytest

from bench.pipeline import pooled, row, summary


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
