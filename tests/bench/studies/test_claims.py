"""python -m bench claims end to end on the tiny pair: each part runs and writes what the claims page reads."""

import json

import pytest

from bench.studies import claims

pytestmark = pytest.mark.slow


def test_claims_measures_temperature_length_and_memory(tiny_pair, tmp_path):
    out = tmp_path / "claims.json"
    assert claims.main(["--model", str(tiny_pair[0]), "--draft-model", str(tiny_pair[1]), "--dtype", "float32",
                        "--workloads", "chat", "--prompts-per-workload", "1", "--temperatures", "0,1.0",
                        "--lengths", "40,120", "--max-tokens", "8", "--threads", "1", "--k", "2",
                        "--out", str(out)]) == 0
    parts = json.loads(out.read_text())["parts"]
    assert [(r["temperature"], r["workload"]) for r in parts["temperature"]] == [(0.0, "chat"), (1.0, "chat")]
    for row in parts["temperature"] + parts["length"]:
        assert row["off"]["tok_s"] > 0 and row["spec"]["tok_s"] > 0 and row["speedup"] > 0
        assert row["off"]["acceptance"] is None  # speculation off drafts nothing
    assert [r["target_length"] for r in parts["length"]] == [40, 120]
    assert parts["length"][0]["prompt_tokens"] < parts["length"][1]["prompt_tokens"]
    memory = parts["memory"]
    for stack in ("model draft, after warm-up", "model draft, after the runs", "n-gram draft (no draft model), after warm-up"):
        assert memory[stack]["verifier"]["rss_mib"] > 0 and memory[stack]["draft"]["peak_rss_mib"] > 0
    assert memory["kv_bytes_per_token"]["target"] > 0 and memory["kv_bytes_per_token"]["draft"] > 0
    assert out.with_suffix(".png").stat().st_size > 0


def test_claims_refuses_an_unknown_part(tiny_pair):
    with pytest.raises(SystemExit, match="unknown speed"):
        claims.main(["--model", str(tiny_pair[0]), "--draft-model", str(tiny_pair[1]), "--parts", "speed"])
