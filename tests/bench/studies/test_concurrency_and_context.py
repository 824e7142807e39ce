"""python -m bench context and concurrency end to end on the tiny models: they run and write their JSON."""

import json

import pytest

from bench.studies import concurrency
from bench.studies import context

pytestmark = pytest.mark.slow


def test_context_tool_reports_round_time_per_length_and_k(tiny_pair, tmp_path):
    out = tmp_path / "context.json"
    assert context.main(["--model", str(tiny_pair[0]), "--dtype", "float32", "--lengths", "40,200", "--ks", "0,2",
                         "--repeats", "1", "--max-tokens", "8", "--threads", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [(r["k"], r["context_tokens"]) for r in result["rows"]] == [(0, 40), (0, 200), (2, 40), (2, 200)]
    assert all(r["round_ms_median"] > 0 for r in result["rows"])
    assert set(result["ratios"]) == {"k=0", "k=2"}


def test_concurrency_tool_compares_off_and_adaptive(tiny_pair, tmp_path):
    out = tmp_path / "concurrency.json"
    assert concurrency.main(["--model", str(tiny_pair[0]), "--dtype", "float32", "--streams", "2", "--repeats", "1",
                             "--max-tokens", "8", "--threads", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert {p["method"] for p in result["passes"]} == {"off", "ngram_adaptive"}
    assert result["off_tokens_per_s_median"] > 0 and result["ratio_on_over_off"] > 0
