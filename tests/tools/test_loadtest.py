"""tools/loadtest.py: the latency percentiles it reports."""

from __future__ import annotations

import importlib.util
import pathlib

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_loadtest_percentiles():
    spec = importlib.util.spec_from_file_location("loadtest", REPO_ROOT / "tools" / "loadtest.py")
    loadtest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loadtest)
    values = [float(v) for v in range(1, 101)]
    assert loadtest.percentile(values, 50) == 50
    assert loadtest.percentile(values, 99) == 99
    assert loadtest.percentile(values, 100) == 100
    assert loadtest.percentile([], 50) is None
    assert loadtest.percentile([3.0], 99) == 3.0
