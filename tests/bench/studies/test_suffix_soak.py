"""A bounded soak of the suffix draft as a real process: memory stays flat once the cache is full."""

import pytest

from bench.studies.suffix_soak import soak

pytestmark = pytest.mark.slow


def test_suffix_draft_memory_is_flat_under_a_small_cache_budget(tiny_pair, tmp_path):
    result = soak(str(tiny_pair[0]), requests=300, max_cached_tokens=5000, log_dir=tmp_path)
    assert result["evictions"] > 0, "the budget should have forced evictions"
    assert result["cached_tokens"] <= 5000
    assert result["rss_mib_when_full"] is not None, "the cache never filled"
    assert result["rss_growth"] <= 0.05, f"draft RSS grew {result['rss_growth']:.1%} after the cache filled"
    assert result["proposed_tokens"] > 0, "repeated records should be drafted from the cache"
