"""What machine a result was measured on: CPU model, the flags that change speculation's figures, versions.

Every study records this with its result, so that only ratios from one machine are compared.
"""

from __future__ import annotations

import os
import pathlib
import platform
import time

FLAGS_THAT_MATTER = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
                     "amx_tile", "amx_bf16", "amx_int8")


def cpu_model_and_flags() -> tuple[str, set[str]]:
    """The first CPU's model name and flags from /proc/cpuinfo (the platform's name and no flags elsewhere)."""
    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        lines = pathlib.Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return cpu, flags
    cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), cpu)
    flags = next((set(line.split(":", 1)[1].split()) for line in lines if line.startswith("flags")), flags)
    return cpu, flags


def machine_info(threads: int, omp_wait_policy: str) -> dict:
    """The machine, for a study that runs a torch model."""
    import torch
    import transformers

    cpu, flags = cpu_model_and_flags()
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_flags": [f for f in FLAGS_THAT_MATTER if f in flags],
            "avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags, "threads": threads,
            "platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "gpu": None, "omp_wait_policy": omp_wait_policy,
            "load_avg_start": [round(x, 2) for x in os.getloadavg()]}


def python_machine() -> dict:
    """The machine, for a study of pure-Python code: flags, and the CPU time of a bare loop to scale figures by."""
    cpu, flags = cpu_model_and_flags()
    started = time.thread_time()
    total = 0
    for i in range(3_000_000):
        total += i
    return {"cpu": cpu, "cores": os.cpu_count(), "flags": sorted(flags & {"avx2", "avx512f", "avx512_bf16", "amx_bf16"}),
            "python": platform.python_version(), "load_avg_start": [round(x, 2) for x in os.getloadavg()],
            # CPU seconds for a bare 3,000,000-step Python loop: scales the figures between machines
            "python_loop_3M_cpu_s": round(time.thread_time() - started, 3)}


def process_memory_mib(pid: int, field: str = "VmRSS") -> float:
    """A process's memory from /proc/PID/status: VmRSS (resident now) or VmHWM (its peak), in MiB."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise ValueError(f"/proc/{pid}/status has no {field} line")
