"""Does speculation still pay under concurrent load? Total tokens/s of N streams, speculation off vs on.

    python -m bench concurrency --model .cache/models/smollm2-135m-instruct [--engine vllm] [--streams 8]

Starts the stack (n-gram draft) once and runs passes of N concurrent streaming requests over the
shipped workloads' prompts: one pass with `num_speculative_tokens=0`, one with it unset (the
server's adaptive k), alternating, R times. Reports total completion tokens/s per pass and the
median ratio on/off. Writes OUT.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import pathlib
import statistics
import time

from bench.core.methods import StackMethod, add_stack_options, stack_kwargs
from bench.core.workloads import CLASSIC_WORKLOADS, load_workload


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_stack_options(parser, repeats=3)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--spec-max-concurrency", type=int, default=0, help="passed to the verifier")
    return parser


def run_pass(method: StackMethod, prompts, streams: int, max_tokens: int) -> dict:
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        samples = list(pool.map(lambda p: method.run(p, 0, max_tokens=max_tokens), prompts))
    wall = time.perf_counter() - started
    tokens = sum(s.completion_tokens for s in samples)
    drafted = sum(s.num_draft_tokens for s in samples)
    return {"method": method.name, "wall_s": round(wall, 3), "tokens": tokens, "tokens_per_s": round(tokens / wall, 2),
            "acceptance_rate": round(sum(s.num_accepted_tokens for s in samples) / drafted, 3) if drafted else None}


def main(argv=None) -> int:
    from tqdm import tqdm

    from devkit.stack import running_stack

    args = build_parser().parse_args(argv)
    prompts = []
    for name in CLASSIC_WORKLOADS:
        prompts += load_workload(name, max_prompts=max(1, args.streams // 4), max_tokens=args.max_tokens)
    prompts = [p for p in prompts if p.workload != "long_prompt"][: args.streams * 2]
    passes = []
    with running_stack(args.model, **stack_kwargs(args, ["--spec-max-concurrency", str(args.spec_max_concurrency)])
                       ) as services:
        gateway, metrics = services["gateway"].address, services["verifier"].metrics_port
        methods = [StackMethod("off", gateway, metrics, k=0), StackMethod("ngram_adaptive", gateway, metrics, k=None)]
        for method in methods:
            method.run(prompts[0], -1, max_tokens=8)  # warm-up
        with tqdm(total=args.repeats * len(methods), desc=f"{args.streams} streams", unit="pass") as bar:
            for repeat in range(args.repeats):
                for method in (methods if repeat % 2 == 0 else methods[::-1]):
                    passes.append(run_pass(method, prompts, args.streams, args.max_tokens))
                    bar.update(1)
        for method in methods:
            method.close()
    off = [p["tokens_per_s"] for p in passes if p["method"] == "off"]
    on = [p["tokens_per_s"] for p in passes if p["method"] != "off"]
    result = {"what": f"total completion tokens/s of {args.streams} concurrent streams, speculation off vs adaptive",
              "engine": args.engine, "model": pathlib.Path(args.model).name, "dtype": args.dtype,
              "streams": args.streams, "prompts_per_pass": len(prompts), "max_tokens": args.max_tokens,
              "repeats": args.repeats, "cores": os.cpu_count(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "off_tokens_per_s_median": statistics.median(off), "on_tokens_per_s_median": statistics.median(on),
              "ratio_on_over_off": round(statistics.median(on) / statistics.median(off), 3), "passes": passes}
    out = pathlib.Path(args.out or f"bench/results/concurrency_{args.engine}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{args.streams} streams, {args.engine}: off {result['off_tokens_per_s_median']} tok/s, adaptive "
          f"{result['on_tokens_per_s_median']} tok/s: {result['ratio_on_over_off']}x; wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
