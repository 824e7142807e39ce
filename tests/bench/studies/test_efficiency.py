"""bench.studies.efficiency's arithmetic: alpha measured from the verifier's counters, the round split, the
prediction and measured/predicted; and the whole study on a tiny random target through the real stack."""

import json

import pytest

from bench.core.speedup_model import expected_tokens, with_prefill
from bench.studies import efficiency
from bench.studies.efficiency import Run, alpha_hat, cell, predict, split


def test_alpha_hat_counts_each_rejection_once_and_full_blocks_as_none():
    # 4 rounds at k = 2: accepted 2, 2, 1, 0 -> 5 accepted, 2 rejections (the two full blocks end with none)
    assert alpha_hat(accepted=5, drafts=4, accepted_per_position=[3, 2], k=2) == pytest.approx(5 / 7)
    assert alpha_hat(accepted=0, drafts=0, accepted_per_position=[], k=4) is None
    assert alpha_hat(accepted=0, drafts=3, accepted_per_position=[], k=4) == 0.0


def test_the_prediction_is_the_speedup_model_with_the_measured_split():
    curve = {1: 1.0, 3: 1.5}
    p = predict(0.5, 2, curve, t1=0.010, wait=0.002, transport=0.001, transport_off=0.0005, prefill_share=0.0)
    assert p["E"] == pytest.approx(1.75) and p["v"] == 1.5 and p["c_k"] == pytest.approx(0.2)
    assert p["predicted"] == pytest.approx(1.75 * 1.05 / (0.2 + 1.5 + 0.1), abs=1e-3)
    assert p["ideal"] == pytest.approx(1.75 / 1.5, abs=1e-3)
    kept = predict(0.5, 2, curve, 0.010, 0.002, 0.001, 0.0005, prefill_share=0.2)
    assert kept["predicted"] == pytest.approx(with_prefill(1.75 * 1.05 / 1.8, 0.2), abs=1e-3)


def turn(tokens: int, wall: float, ttft: float, rounds: int, forward: float, wait: float = 0.0, drafts: int = 0,
         accepted: int = 0, per_position=(), k: int = 2) -> dict:
    run = Run([0] * tokens, wall, ttft, rounds, drafts, k * drafts, accepted, list(per_position))
    return {"runs": [run], "wall_s": wall, "forward_s": forward * rounds, "forward_count": rounds,
            "wait_s": wait * rounds}


def test_a_cell_is_measured_against_off_and_its_ratio_is_measured_over_predicted():
    off = [turn(tokens=20, wall=0.22, ttft=0.02, rounds=20, forward=0.009)]  # 1 ms a round outside the forward
    # 20 tokens in 11 rounds at k = 2: 10 drafted rounds, 9 accepted in all, 2 of them full
    spec = [turn(tokens=20, wall=0.165, ttft=0.015, rounds=11, forward=0.0135, wait=0.0005, drafts=10, accepted=9,
                 per_position=[7, 2])]
    split_off, split_spec = split(off), split(spec)
    assert split_off["round_s"] == pytest.approx(0.2 / 19) and split_off["transport_s"] == pytest.approx(0.2 / 19 - 0.009)
    assert split_spec["draft_wait_s"] == pytest.approx(0.0005)
    row = cell("serial", 1, 0.5, 2, spec, off, {1: 1.0, 3: 1.5})
    assert row["speedup"] == pytest.approx(0.22 / 0.165, abs=1e-3)
    assert row["alpha_measured"] == pytest.approx(9 / (9 + 10 - 2), abs=1e-4)
    assert row["acceptance_rate"] == pytest.approx(9 / 20)
    assert row["forward_ratio"] == pytest.approx(1.5)
    assert row["E"] == pytest.approx(expected_tokens(row["alpha_measured"], 2), abs=1e-3)
    assert row["measured_over_predicted"] == pytest.approx(row["speedup"] / row["predicted"], abs=2e-3)
    assert row["measured_over_ideal"] == pytest.approx(row["speedup"] / row["ideal"], abs=2e-3)


@pytest.mark.slow
def test_the_study_runs_through_the_real_stack_on_a_tiny_target(tmp_path):
    """One alpha, serial, k = 2, one short prompt: the JSON, the table and the plot, with every ratio its own
    speedup over its own prediction."""
    out = tmp_path / "eff"
    assert efficiency.main(["--config", "llama-tiny", "--alphas", "0.7", "--ks", "2", "--modes", "serial",
                            "--prompts", "1", "--max-tokens", "12", "--repeats", "1", "--out", str(out)]) == 0
    result = json.loads((out / "efficiency.json").read_text())
    assert "cpu_flags" in result["machine"] and result["verify_cost"]["ratio"]["1"] == 1.0
    (row,) = result["rows"]
    assert (row["mode"], row["alpha"], row["k"]) == ("serial", 0.7, 2) and row["drafts"] > 0
    assert row["measured_over_predicted"] == pytest.approx(row["speedup"] / row["predicted"], abs=2e-3)
    assert (out / "efficiency.png").stat().st_size > 0 and "measured/predicted" in (out / "efficiency.md").read_text()
    assert len((out / "replay.jsonl").read_text().splitlines()) == 1
