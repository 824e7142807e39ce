"""The grammar-cost study on a tiny seeded model: a constrained output walked in rounds of every k, the grammar's
work timed on both sides beside the forward, written as JSON."""

import json

from bench.studies import grammar_cost


def test_grammar_cost_times_the_grammars_work_beside_the_forward(tiny_pair, tmp_path):
    target, _draft = tiny_pair
    out = tmp_path / "cost.json"
    assert grammar_cost.main(["--model", str(target), "--max-tokens", "12", "--max-k", "2", "--passes", "1",
                              "--threads", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["output_tokens"] >= 3 and result["compile_s"] >= 0
    assert [row["k"] for row in result["rounds"]] == [0, 1, 2]
    for row in result["rounds"]:
        assert row["forward_ms"] > 0 and row["verifier_ms_accepted"] > 0 and row["draft_ms_accepted"] > 0
        assert row["verifier_share"] > 0
        assert ("verifier_ms_rejected" in row) == (row["k"] > 0)
    assert result["machine"]["cpu"]
