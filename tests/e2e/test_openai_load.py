"""python -m bench load end to end on the tiny models: vLLM's serving benchmark drives the gateway's HTTP API.

A tiny sweep (two rates, speculation off and fixed k, three requests a point) through the real
stack and the real `vllm bench serve` module in .venv-vllm; it must complete every request and
write the JSON and the plot. `make bench-load` runs the real sweep on the real model.
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from bench.studies import load
from devkit.stack import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

VLLM_PYTHON = os.environ.get("SPECDEC_VLLM_PYTHON", str(REPO_ROOT / ".venv-vllm" / "bin" / "python"))


def test_load_tool_sweeps_rates_and_modes_through_the_http_api(tiny_pair, tmp_path):
    if not pathlib.Path(VLLM_PYTHON).exists():
        pytest.fail(f"{VLLM_PYTHON} is missing: run `make setup-vllm` (or set SPECDEC_VLLM_PYTHON)")
    assert load.main(["--model", str(tiny_pair[0]), "--dtype", "float32", "--threads", "1",
                      "--vllm-python", VLLM_PYTHON, "--rates", "4,16", "--num-prompts", "3", "--max-tokens", "8",
                      "--modes", "off,fixed", "--workloads", "chat,creative", "--results-dir", str(tmp_path),
                      "--name", "tiny"]) == 0
    result = json.loads((tmp_path / "tiny.json").read_text())
    rows = result["rows"]
    assert sorted((r["rate"], r["mode"]) for r in rows) == [(4.0, "fixed"), (4.0, "off"), (16.0, "fixed"),
                                                            (16.0, "off")]
    for row in rows:
        assert (row["completed"], row["failed"]) == (3, 0), row
        assert row["output_throughput"] > 0 and row["median_ttft_ms"] > 0 and row["median_tpot_ms"] > 0
        # what the verifier did, from its /metrics around the point: off never drafts
        assert row["verifier"]["tokens"] >= 3 * 8, row
        assert row["mode"] != "off" or row["verifier"]["drafts"] == 0, row
    assert sum(row["verifier"]["drafts"] for row in rows if row["mode"] == "fixed") > 0
    cross = result["crossover"]
    assert cross["metric"] == "median_tpot_ms" and set(cross["off_over_on"]) == {"4.0", "16.0"}
    assert cross["rate"] is None or 4 <= cross["rate"] <= 16
    assert (tmp_path / "tiny.png").stat().st_size > 10_000
