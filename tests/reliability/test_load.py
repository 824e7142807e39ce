"""Load: tools/loadtest.py at 32 concurrent streaming clients through the gateway (bounded count).

Every response must be complete and error-free; latency, tokens/s and RSS are
recorded. SPECDEC_LOAD_RESULTS=path also writes the JSON there (how
bench/results/load_tiny.json was made).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.reliability.support import API_KEY, gauge, wait_for

pytestmark = pytest.mark.slow

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
REQUESTS = int(os.environ.get("SPECDEC_LOAD_REQUESTS", "96"))
CONCURRENCY = 32


def test_32_concurrent_streams_all_complete(main_stack, tmp_path):
    out = pathlib.Path(os.environ.get("SPECDEC_LOAD_RESULTS", tmp_path / "load.json"))
    pids = [f"--pid={name}={service.process.pid}" for name, service in main_stack.services.items()]
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "loadtest.py"), "--addr", main_stack.gateway.address,
         "--requests", str(REQUESTS), "--concurrency", str(CONCURRENCY), "--max-tokens", "24",
         "--api-key", API_KEY, "--timeout", "180", "--out", str(out), *pids],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=400, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    print("load:", json.dumps(report))
    assert report["ok"] == REQUESTS and report["errors"] == {} and report["incomplete"] == 0
    assert report["completion_tokens"] > 0 and report["tokens_per_s"] > 0
    assert report["latency_ms"]["p50"] <= report["latency_ms"]["p99"]
    assert set(report["rss_mib"]) == {"draft", "verifier", "gateway"}
    assert wait_for(lambda: all(gauge(s) == 0 for s in main_stack.services.values()), 30)
