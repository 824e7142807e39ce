"""Helpers over transformers' DynamicCache: its length, and explicit rollback to a position."""

from __future__ import annotations


def new_cache(model):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def cache_length(cache) -> int:
    return int(cache.get_seq_length())


def rollback_cache(cache, length: int) -> None:
    """Drop cached positions past `length`.

    A negative crop removes that many tokens in every transformers release that
    has DynamicCache.crop; a positive argument changed meaning in 5.x.
    """
    extra = cache_length(cache) - length
    if extra > 0:
        cache.crop(-extra)
