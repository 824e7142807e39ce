"""The adaptive policy against fixed k, from samples with known times."""

from bench.core import report
from bench.core.methods import Sample


def _samples():
    """Two repeats of two prompts: ngram (adaptive) 10 tok/s; ngram_k2 10.2, ngram_k4 12.5; suffix alone."""
    out = []
    for repeat in range(2):
        for pid in ("a", "b"):
            out += [Sample("extraction", pid, "ngram", repeat, 10, 1.0),
                    Sample("extraction", pid, "ngram_k2", repeat, 10, 1.0 / 1.02),
                    Sample("extraction", pid, "ngram_k4", repeat, 10, 0.8),
                    Sample("extraction", pid, "suffix", repeat, 10, 0.5),
                    Sample("chat", pid, "ngram", repeat, 10, 1.0),
                    Sample("chat", pid, "ngram_k4", repeat, 10, 1.01)]
    return out


def test_adaptive_is_measured_against_the_best_fixed_k():
    rows = {(r["workload"], r["proposer"]): r for r in report.adaptive_vs_fixed(_samples())}
    extraction = rows[("extraction", "ngram")]
    assert extraction["adaptive_over_fixed"] == {2: 0.98, 4: 0.8}
    assert extraction["best_fixed_k"] == 4 and extraction["adaptive_over_best"] == 0.8
    assert extraction["met"] is False
    chat = rows[("chat", "ngram")]
    assert chat["best_fixed_k"] == 4 and chat["met"] is True  # adaptive 1.01x of k=4
    assert ("extraction", "suffix") not in rows  # no fixed-k suffix ran beside it


def test_the_markdown_names_the_figure():
    result = {"model": "m", "dtype": "float32", "date": "d", "rows": [], "machine": {},
              "config": {"repeats": 2}, "adaptive_vs_fixed": report.adaptive_vs_fixed(_samples())}
    text = report.markdown(result)
    assert "| extraction | ngram | k=2: 0.98x, k=4: 0.80x | 4 | 0.80x | NO |" in text
    assert "| chat | ngram | k=4: 1.01x | 4 | 1.01x | yes |" in text
