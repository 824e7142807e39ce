"""Before serving: time the target's forward over a few block sizes, so that the first request is priced on them.

A fresh verifier knows no forward times: the policy then prices every block size alike (one size timed gives a flat
curve), and blocks a draft sizes by its evidence (the hybrid's suffix side, cut on the forward's times) were verified
16 deep in a fresh stack's first request, where a warm one verified a few tokens. The first forwards are also the
slowest (the kernels' first runs). So at start-up the engine times a round's forward at the sizes the policy weighs
most, on a dummy sequence, and the server-wide `RoundCost` starts with them as its evidence; rounds then replace it
as they are timed (an average that weighs the newest).
"""

from __future__ import annotations

import asyncio
import logging

from verifier_service.speculation.policy import RoundCost

log = logging.getLogger("verifier_service")


def calibration_sizes(max_k: int) -> list[int]:
    """0 (a plain step), then powers of two up to max_k, and max_k."""
    sizes, n = [0], 1
    while n < max_k:
        sizes.append(n)
        n *= 2
    return sizes + [max_k] if max_k > 0 else sizes


async def calibrate_forward(engine, cost: RoundCost, max_k: int, repeats: int = 2) -> list[tuple[int, float]]:
    """Time the engine's forward at `calibration_sizes(max_k)`, record each sample in `cost`, and return the samples.
    Nothing is timed where the engine cannot time its forward alone (vLLM: `Engine`'s optional time_forwards)."""
    time_forwards = getattr(engine, "time_forwards", None)
    if time_forwards is None:
        return []
    sizes = calibration_sizes(max_k)
    samples = await asyncio.get_running_loop().run_in_executor(None, time_forwards, sizes, repeats)
    for n, seconds in samples:
        cost.observe_forward(n, seconds)
    shown = ", ".join(f"{n}: {1000 * t:.0f} ms" for n, t in samples[-len(sizes):])
    log.info("target forward by draft tokens verified (start-up calibration): %s", shown)
    return samples
