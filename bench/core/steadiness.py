"""How steady is this machine's CPU right now? A fixed piece of work, timed several times.

On the shared 2-core machines this project is measured on, the same matmul loop has taken anywhere from
0.30 to 0.52 s within one minute with nothing else running (2026-12-01): a benchmark whose modes differ
by less than that spread cannot tell them apart in one pass. Benchmarks record this probe before and
after their sweep, so a reader can see whether a difference is larger than the machine's own drift.
"""

from __future__ import annotations

import time


def probe(repeats: int = 8, size: int = 512, matmuls: int = 100) -> dict:
    """Time `matmuls` fp32 [size, size] matmuls, `repeats` times, on the threads torch uses."""
    import torch

    a = torch.randn(size, size)
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(matmuls):
            a @ a
        seconds.append(time.perf_counter() - started)
    # the spread from the unrounded times: rounded to 0.1 ms, a small probe's fastest pass read 0.0 (a CI run)
    return {"work": f"{matmuls} fp32 {size}x{size} matmuls, {torch.get_num_threads()} threads",
            "seconds": [round(s, 6) for s in seconds], "spread": round(max(seconds) / min(seconds), 3)}
