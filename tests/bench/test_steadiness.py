from bench.steadiness import probe


def test_the_probe_times_the_same_work_each_time_and_reports_the_spread():
    result = probe(repeats=3, size=64, matmuls=5)
    assert len(result["seconds"]) == 3 and all(s > 0 for s in result["seconds"])
    assert result["spread"] == round(max(result["seconds"]) / min(result["seconds"]), 3) >= 1.0
    assert "64x64" in result["work"]
