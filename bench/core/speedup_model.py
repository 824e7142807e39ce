"""The benchmark's side of the speedup model: acceptance rate <-> alpha, break-even, and the ceiling.

The model itself (E, v(n) = t(n)/t(1), S) is `specdec.decoding.speedup`, shared with the advisor and the
verifier. Measured acceptance *rate* (accepted / drafted, vLLM's convention) is a different
number from the per-token alpha; `rate_from_alpha` and `alpha_from_rate` convert between them
under the model's i.i.d. assumption. Whatever alpha is, tokens per drafted round are exactly
1 + k * rate.
"""

from __future__ import annotations

import math

from specdec.decoding.speedup import (  # noqa: F401 (API)
    VerifyCurve,
    best_k,
    expected_tokens,
    predicted_speedup,
    predicted_speedup_of_rounds,
    verify_cost,
    with_prefill,
)


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


def break_even_alpha(k: float, curve: VerifyCurve | None = None, c: float = 0.0, rho: float = 0.0) -> float:
    """The smallest alpha at which speculation at block length k pays (S = 1); inf when even alpha = 1 loses."""
    if predicted_speedup(1.0, k, curve, c, rho) < 1.0:
        return math.inf
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if predicted_speedup(mid, k, curve, c, rho) < 1.0:
            lo = mid
        else:
            hi = mid
    return hi


def ceiling(curve: VerifyCurve | None, k_max: int = 16, c: float = 0.0, rho: float = 0.0,
            rho_off: float = 0.0) -> tuple[int, float]:
    """The best any draft can do on this machine: every token accepted (E = k + 1), at the best k.

    Returns (k, speedup). A target figure above it is impossible here, whatever the draft.
    """
    scored = [(predicted_speedup(1.0, k, curve, c, rho, rho_off), k) for k in range(1, k_max + 1)]
    speedup, k = max(scored)
    return k, speedup
