"""Where the benchmark keeps its inputs and outputs, whichever module asks."""

import pathlib

BENCH_DIR = pathlib.Path(__file__).resolve().parent.parent
RESULTS_DIR = BENCH_DIR / "results"
WORKLOAD_DIR = BENCH_DIR / "workloads"
