import pytest

from bench.core.steadiness import probe


def test_the_probe_times_the_same_work_each_time_and_reports_the_spread():
    result = probe(repeats=3, size=64, matmuls=50)
    assert len(result["seconds"]) == 3 and all(s > 0 for s in result["seconds"])
    assert result["spread"] >= 1.0
    assert result["spread"] == pytest.approx(max(result["seconds"]) / min(result["seconds"]), rel=0.02)  # times are kept to the microsecond
    assert "64x64" in result["work"]
