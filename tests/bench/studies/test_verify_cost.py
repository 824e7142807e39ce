"""The verify-cost curve tool on a tiny random model: it writes a curve with t(1)/t(1) = 1 and a plot."""

import json

import pytest

from bench.studies import verify_cost


def test_verify_cost_writes_a_curve_per_context(tmp_path):
    out = tmp_path / "vc"
    assert verify_cost.main(["--config", "llama-tiny", "--dtype", "float32", "--max-k", "3", "--repeats", "2",
                             "--warmup", "1", "--contexts", "8,40", "--out", str(out)]) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    assert [curve["context"] for curve in result["curves"]] == [8, 40]
    for curve in result["curves"]:
        assert list(curve["ratio"]) == ["1", "2", "3"]
        assert curve["ratio"]["1"] == 1.0
        assert all(t > 0 for t in curve["t_ms"].values())
    assert out.with_suffix(".png").stat().st_size > 1000


def test_attention_both_measures_the_two_attentions_side_by_side(tmp_path):
    out = tmp_path / "vc"
    assert verify_cost.main(["--config", "llama-tiny", "--dtype", "float32", "--max-k", "2", "--repeats", "1",
                             "--warmup", "1", "--contexts", "8", "--attention", "both", "--out", str(out)]) == 0
    curves = json.loads(out.with_suffix(".json").read_text())["curves"]
    assert [(curve["attention"], curve["prepacked"]) for curve in curves] == [("sdpa", True), ("sdpa_gqa", True)]
    assert verify_cost.read_for_run(out.with_suffix(".json"), 200)["attention"] == "sdpa_gqa"  # as the verifier runs
    with pytest.raises(SystemExit, match="one thing at a time"):
        verify_cost.main(["--config", "llama-tiny", "--dtype", "float32", "--prepack", "both", "--attention", "both",
                          "--out", str(out)])
