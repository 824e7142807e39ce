"""bench.core.intervals: a paired ratio and its 95% interval."""

import math

import pytest

from bench.core.intervals import ratio_interval, t_95


def test_the_ratio_is_the_geometric_mean_of_the_pairs_and_its_interval_widens_with_their_spread():
    steady = ratio_interval([(2.0, 1.0), (2.0, 1.0), (2.0, 1.0)])
    assert steady == {"ratio": 2.0, "pairs": 3, "low": 2.0, "high": 2.0}
    spread = ratio_interval([(1.5, 1.0), (1.0, 1.0), (1.0, 1.5)])
    assert spread["ratio"] == pytest.approx(1.0, abs=1e-3)
    # the logs are +0.405, 0, -0.405: sd 0.405, t(2) 4.303, over sqrt(3)
    half = 4.303 * math.log(1.5) / math.sqrt(3)
    assert spread["low"] == round(math.exp(-half), 3) and spread["high"] == round(math.exp(half), 3)
    assert spread["low"] < 0.4 and spread["high"] > 2.5  # three prompts this far apart tell nothing


def test_one_pair_has_no_interval_and_none_has_no_ratio():
    assert ratio_interval([(3.0, 2.0)]) == {"ratio": 1.5, "pairs": 1, "low": None, "high": None}
    assert ratio_interval([]) is None and ratio_interval([(0.0, 1.0)]) is None


def test_the_t_quantile_is_never_narrower_than_the_true_one():
    assert t_95(2) == 4.303 and t_95(11) == 2.228 and t_95(500) == 1.96
