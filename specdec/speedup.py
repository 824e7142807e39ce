"""The speedup model's core: how many tokens a speculative round emits on average (Leviathan et al. 2023)."""

from __future__ import annotations


def expected_tokens(alpha: float, k: float) -> float:
    """E: tokens one round emits (accepted drafts + the target's own), for per-token acceptance alpha."""
    if k <= 0:
        return 1.0
    if alpha >= 1.0:
        return k + 1.0
    if alpha <= 0.0:
        return 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)
