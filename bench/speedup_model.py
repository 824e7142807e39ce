"""The speedup model of docs/DESIGN: E = (1 - a^(k+1)) / (1 - a), S = E / (k*c + 1 + rho).

a (alpha) is the per-token acceptance probability, k the block length, c the
draft step cost over the target step cost, rho the per-round transport cost over
the target step cost. Measured acceptance *rate* (accepted / drafted, vLLM's
convention) is a different number; `rate_from_alpha` and `alpha_from_rate`
convert between them under the model's i.i.d. assumption. Whatever alpha is,
tokens per drafted round are exactly 1 + k * rate.
"""

from __future__ import annotations

import math

from specdec.speedup import expected_tokens  # noqa: F401 (part of this module's API)


def predicted_speedup(alpha: float, k: float, c: float = 0.0, rho: float = 0.0) -> float:
    """S = E / (k*c + 1 + rho): speculative tokens/s over plain decoding tokens/s."""
    return expected_tokens(alpha, k) / (k * c + 1.0 + rho)


def rate_from_alpha(alpha: float, k: float) -> float:
    """Accepted / drafted for per-token acceptance alpha: (E - 1) / k."""
    if k <= 0:
        return 0.0
    return (expected_tokens(alpha, k) - 1.0) / k


def alpha_from_rate(rate: float, k: float, tol: float = 1e-9) -> float:
    """Invert rate_from_alpha by bisection (it is increasing in alpha)."""
    if k <= 0 or rate <= 0:
        return 0.0
    if rate >= 1:
        return 1.0
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if rate_from_alpha(mid, k) < rate:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def alpha_from_mean_accepted_length(mean_accepted_length: float, k: float) -> float:
    """Per-token alpha implied by tokens per drafted round (1 + accepted / drafts) at block length k."""
    if k <= 0 or mean_accepted_length <= 1:
        return 0.0
    return alpha_from_rate((mean_accepted_length - 1.0) / k, k)


def best_k(alpha: float, c: float, rho: float, k_max: int = 16) -> tuple[int, float]:
    """The k in 1..k_max with the highest predicted speedup, and that speedup."""
    scored = [(predicted_speedup(alpha, k, c, rho), k) for k in range(1, k_max + 1)]
    speedup, k = max(scored)
    return k, speedup


def break_even_alpha(k: float, c: float, rho: float) -> float:
    """The smallest alpha at which speculation at block length k pays (S = 1)."""
    if predicted_speedup(1.0, k, c, rho) < 1.0:
        return math.inf
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if predicted_speedup(mid, k, c, rho) < 1.0:
            lo = mid
        else:
            hi = mid
    return hi
