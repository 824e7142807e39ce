"""The warm-up curve and the suffix-vs-ngram figures, from samples with known times."""

import pytest

from bench.core import warmup
from bench.core.methods import Sample


def _samples():
    """extraction: 6 requests; suffix is as fast as off for the first 4, then 2.5x. chat: 3 requests."""
    out = []
    for repeat in range(2):
        for position in range(6):
            pid = f"r{position}"
            out.append(Sample("extraction", pid, "off", repeat, 10, 1.0, position=position))
            out.append(Sample("extraction", pid, "ngram", repeat, 10, 0.8, num_drafts=2, num_draft_tokens=8,
                              num_accepted_tokens=2, position=position))
            out.append(Sample("extraction", pid, "suffix", repeat, 10, 1.0 if position < 4 else 0.4, num_drafts=2,
                              num_draft_tokens=8, num_accepted_tokens=1 if position < 4 else 6, position=position))
        for position in range(3):
            out.append(Sample("chat", f"c{position}", "off", repeat, 10, 1.0, position=position))
            out.append(Sample("chat", f"c{position}", "ngram", repeat, 10, 0.8, position=position))
            out.append(Sample("chat", f"c{position}", "suffix", repeat, 10, 0.9, position=position))
    out.append(Sample("extraction", "r0", "suffix", -1, 16, 0.1, position=0))  # a warm-up request: ignored
    return out


def test_curve_by_position():
    curves = warmup.curves(_samples())
    suffix = curves["extraction"]["suffix"]
    assert [p["position"] for p in suffix] == list(range(6))
    assert [p["speedup"] for p in suffix] == [1.0] * 4 + [2.5] * 2
    assert [p["acceptance"] for p in suffix] == [0.125] * 4 + [0.75] * 2
    assert all(p["repeats"] == 2 for p in suffix)
    assert {p["speedup"] for p in curves["extraction"]["ngram"]} == {1.25}


def test_samples_without_a_position_are_left_out():
    old = [Sample("copy", "a", "suffix", 0, 10, 1.0), Sample("copy", "a", "off", 0, 10, 1.0)]
    assert warmup.curves(old) == {}


def test_comparison_and_figures():
    rows = {r["workload"]: r for r in warmup.comparison(_samples(), ["extraction"], verify_t4=1.1)}
    extraction, chat = rows["extraction"], rows["chat"]
    assert extraction["repetitive"] and not chat["repetitive"]
    assert extraction["suffix_vs_ngram_after"] == 2.0  # 25 tok/s over 12.5
    assert extraction["suffix_vs_off_after"] == 2.5 and extraction["ngram_vs_off_after"] == 1.25
    assert extraction["suffix_vs_off"] == pytest.approx(60 / 4.8 / 10)  # all six requests pooled
    assert chat["suffix_vs_ngram"] == pytest.approx(0.8 / 0.9, abs=1e-3) and "suffix_vs_ngram_after" not in chat
    after, cheap = extraction["figures"]
    assert after["met"] is True and after["value"] == 2.0
    assert cheap["met"] is False  # verification is cheap here (1.1), and 1.25x < 2.0x
    assert chat["figures"][0]["met"] is False  # 0.89 < 0.97


def test_the_cheap_verification_figure_does_not_apply_on_an_expensive_curve():
    rows = {r["workload"]: r for r in warmup.comparison(_samples(), ["extraction"], verify_t4=2.1)}
    cheap = rows["extraction"]["figures"][1]
    assert cheap["met"] is None and "not applicable" in cheap["text"]


def test_no_suffix_no_comparison():
    assert warmup.comparison([s for s in _samples() if s.method != "suffix"], ["extraction"]) == []


def test_warmup_plot(tmp_path):
    samples = _samples()
    result = {"model": "/m/smol", "dtype": "float32", "date": "2026-01-01",
              "warmup": {"skip": 4, "repetitive": ["extraction"], "curves": warmup.curves(samples)}}
    warmup.plot(tmp_path / "w.png", result)
    assert (tmp_path / "w.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
