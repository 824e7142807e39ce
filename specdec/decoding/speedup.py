"""The speedup model, with the machine's verify cost (Leviathan et al. 2023; docs/benchmark.md).

Speculative decoding runs in rounds. A round that drafts k tokens runs the draft (k steps of
relative cost c), one target forward over k + 1 tokens (the last verified token and the k
drafts) and the transport between the services (rho, in target steps). It emits E tokens:

    E(alpha, k) = (1 - alpha^(k+1)) / (1 - alpha)        (i.i.d. per-token acceptance alpha)
    cost(k)     = k c + v(k + 1) + rho,   v(n) = t(n) / t(1)
    S           = E (1 + rho_off) / cost(k)

against plain decoding that pays one step plus its own per-token overhead rho_off. v(n) is the
measured verify-cost curve of the machine (`python -m bench verify-cost`), interpolated
linearly; without a curve v = 1, the classic model, which on a CPU where a 5-token forward
costs 2x a 1-token one predicts twice the speedup it gets.

Glossary: alpha = per-token acceptance probability; acceptance rate = accepted / drafted
tokens (vLLM's convention, a different number); mean accepted length = tokens per drafted
round (1 + accepted / drafted rounds, the target's own token included), which is E measured.
"""

from __future__ import annotations

import bisect
from typing import Mapping

VerifyCurve = Mapping[int, float]  # tokens in one forward n -> t(n) / t(1); must hold n = 1


def expected_tokens(alpha: float, k: float) -> float:
    """E: tokens one round emits (accepted drafts + the target's own), for per-token acceptance alpha."""
    if k <= 0:
        return 1.0
    if alpha >= 1.0:
        return k + 1.0
    if alpha <= 0.0:
        return 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def verify_cost(curve: VerifyCurve | None, n: float) -> float:
    """v(n) = t(n) / t(1): a forward over n tokens against one, from a measured curve.

    Linear between measured points; past the last point it continues the last segment's
    slope (never below the last value). None: the classic model's 1.0 for every n.
    """
    if curve is None:
        return 1.0
    points = sorted((int(k), float(v)) for k, v in curve.items())
    if not points or points[0][0] != 1:
        raise ValueError(f"a verify-cost curve needs the point n = 1, got n = {[k for k, _ in points]}")
    if n <= 1:
        return points[0][1]
    ns = [k for k, _ in points]
    i = bisect.bisect_left(ns, n)
    if i < len(points) and ns[i] == n:
        return points[i][1]
    if i == len(points):  # past the last point
        if len(points) == 1:
            return points[0][1]
        (n0, v0), (n1, v1) = points[-2], points[-1]
        return v1 + max(0.0, (v1 - v0) / (n1 - n0)) * (n - n1)
    (n0, v0), (n1, v1) = points[i - 1], points[i]
    return v0 + (v1 - v0) * (n - n0) / (n1 - n0)


def round_cost(k: float, curve: VerifyCurve | None = None, c: float = 0.0, rho: float = 0.0) -> float:
    """A round that drafts k tokens, in target steps: k c + v(k + 1) + rho (k = 0: a plain step + rho)."""
    k = max(0.0, k)
    return k * c + verify_cost(curve, k + 1) + rho


def predicted_speedup(alpha: float | None, k: float, curve: VerifyCurve | None = None, c: float = 0.0,
                      rho: float = 0.0, rho_off: float = 0.0, mean_accepted_length: float | None = None) -> float:
    """S = E (1 + rho_off) / (k c + v(k + 1) + rho): speculative tokens/s over plain decoding tokens/s.

    E from alpha (the i.i.d. model), or the measured mean accepted length when given (then alpha
    may be None). Every round drafts k tokens.
    """
    if mean_accepted_length is not None:
        e = mean_accepted_length
    elif alpha is not None:
        e = expected_tokens(alpha, k)
    else:
        raise ValueError("predicted_speedup needs alpha or mean_accepted_length")
    return e * (1.0 + rho_off) / round_cost(k, curve, c, rho)


def predicted_speedup_of_rounds(tokens: float, rounds_by_block: Mapping[float, float],
                                curve: VerifyCurve | None = None, c: float = 0.0, rho: float = 0.0,
                                rho_off: float = 0.0) -> float:
    """The model for a measured mix of rounds: tokens emitted over the rounds' summed cost.

    rounds_by_block: block length -> rounds drafted at that length (0: rounds that drafted
    nothing, e.g. no match). Plain decoding emits 1 token per (1 + rho_off) steps.
    """
    cost = sum(n * round_cost(k, curve, c, rho) for k, n in rounds_by_block.items())
    if cost <= 0:
        raise ValueError("predicted_speedup_of_rounds needs at least one round")
    return tokens * (1.0 + rho_off) / cost


def with_prefill(decode_speedup: float, prefill_share: float, draft_read_share: float = 0.0) -> float:
    """End-to-end speedup when a share of plain decoding's wall time is prefill, which speculation leaves as is.

    draft_read_share: the time a draft model takes to read the prompt, as a share of plain decoding's wall time; it
    reads it before its first block, after the target's prefill, so speculation adds it (0: a draft without a model).
    """
    prefill_share = min(max(prefill_share, 0.0), 1.0)
    return 1.0 / (prefill_share + max(draft_read_share, 0.0) + (1.0 - prefill_share) / decode_speedup)


def best_k(alpha: float, curve: VerifyCurve | None = None, c: float = 0.0, rho: float = 0.0,
           k_max: int = 16) -> tuple[int, float]:
    """The block length 0..k_max with the highest predicted speedup, and that speedup (k = 0: don't speculate)."""
    scored = [(predicted_speedup(alpha, k, curve, c, rho, rho) if k else 1.0, -k) for k in range(k_max + 1)]
    speedup, neg_k = max(scored)
    return -neg_k, speedup
