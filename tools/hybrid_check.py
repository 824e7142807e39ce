"""The hybrid draft on the Qwen2.5-Coder pair: model, suffix and hybrid side by side, interleaved, on code prompts.

One stack per method (the 1.5B verifies in each; model and hybrid draft with the 0.5B), all up at once. For each
prompt of bench/workloads/code.jsonl (greedy): speculation off (k = 0) once, then each method at adaptive k, the
methods' order rotating from prompt to prompt so that none always runs first on a warm cache; every output must be
the plain run's. Prints a JSON line per run and, at the end, each method's tokens/s summed over the prompts, its
ratio to off, and the hybrid's blocks by side (from the draft's /metrics); --out writes it all with the machine
(CPU model and flags). The machine may be shared: quote the figures with that.

    python -m tools.hybrid_check --model .cache/models/qwen2.5-coder-1.5b --draft-model .cache/models/qwen2.5-coder-0.5b \\
        --dtype bfloat16 --prompts refactor_type_hints,py_class_stack --out bench/results/pair/hybrid_check.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import sys
import tempfile
import time

import grpc

from bench.core.machine import machine_info
from bench.core.workloads import workload_path
from devkit.stack import running_stack, scrape_metrics
from specdec.v1 import gateway_pb2_grpc
from tools.pair_check import cpu, run

METHODS = ("model", "suffix", "hybrid")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="target model directory")
    parser.add_argument("--draft-model", required=True, help="the draft model (model and hybrid)")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each verifier")
    parser.add_argument("--prompts", default="", help="comma-separated ids from code.jsonl (default: the first 4)")
    parser.add_argument("--max-tokens", type=int, default=64, help="cap on each prompt's max_tokens")
    parser.add_argument("--draft-arg", action="append", default=[], help="extra flag for the hybrid's draft")
    parser.add_argument("--methods", default=",".join(METHODS), help="which of model, suffix, hybrid to run")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    methods = tuple(m for m in METHODS if m in args.methods.split(","))
    lines = [json.loads(line) for line in workload_path("code").read_text().splitlines() if line.strip()]
    wanted = [p for p in args.prompts.split(",") if p]
    prompts = [line for line in lines if line["id"] in wanted] if wanted else lines[:4]
    print(f"cpu: {cpu()}", flush=True)
    env = {"OMP_WAIT_POLICY": "PASSIVE"}
    verifier = ["--dtype", args.dtype, "--threads", str(args.threads)]
    runs = []
    with tempfile.TemporaryDirectory() as logs, contextlib.ExitStack() as stacks:
        started = time.monotonic()
        services = {method: stacks.enter_context(running_stack(
            args.model, args.draft_model, method=method, verifier_args=verifier, env=env, timeout_s=900,
            draft_args=(["--dtype", args.dtype] if method != "suffix" else [])
            + (args.draft_arg if method == "hybrid" else []), log_dir=pathlib.Path(logs)))
            for method in methods}
        print(f"stacks SERVING after {time.monotonic() - started:.0f} s", flush=True)
        stubs = {m: gateway_pb2_grpc.GatewayStub(stacks.enter_context(grpc.insecure_channel(s["gateway"].address)))
                 for m, s in services.items()}
        for i, prompt in enumerate(prompts):
            max_tokens = min(args.max_tokens, prompt["max_tokens"])
            plain = run(stubs[methods[-1]], prompt["prompt"], max_tokens, 0)
            print(json.dumps({"prompt": prompt["id"], "method": "off",
                              **{k: v for k, v in plain.items() if k != "tokens"}}), flush=True)
            runs.append({"prompt": prompt["id"], "method": "off", **plain, "identical": True})
            for method in methods[i % len(methods):] + methods[:i % len(methods)]:
                result = run(stubs[method], prompt["prompt"], max_tokens, None)
                row = {"prompt": prompt["id"], "method": method, "identical": result["tokens"] == plain["tokens"],
                       "vs_off": round(result["tok_s"] / plain["tok_s"], 3),
                       **{k: v for k, v in result.items() if k != "tokens"}}
                print(json.dumps(row), flush=True)
                runs.append({**row, "tokens": result["tokens"]})
        scraped = scrape_metrics(services["hybrid"]["draft"].metrics_port) if "hybrid" in services else {}
        hybrid_blocks = {side: scraped.get(("specdec_draft_hybrid_blocks_total", (("source", side),)), 0.0)
                         for side in ("suffix", "model")}
    summary = {}
    for method in ("off", *methods):
        mine = [r for r in runs if r["method"] == method]
        tokens, seconds = sum(len(r["tokens"]) for r in mine), sum(r["seconds"] for r in mine)
        summary[method] = {"tok_s": round(tokens / seconds, 3), "identical": all(r["identical"] for r in mine)}
    for method in methods:
        summary[method]["vs_off"] = round(summary[method]["tok_s"] / summary["off"]["tok_s"], 3)
    identical = all(r["identical"] for r in runs)
    print(json.dumps({"summary": summary, "hybrid_blocks": hybrid_blocks}), flush=True)
    print("greedy output identical to k = 0 on every run" if identical else "OUTPUT DIFFERS", flush=True)
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.out).write_text(json.dumps({
            "model": pathlib.Path(args.model).name, "draft_model": pathlib.Path(args.draft_model).name,
            "dtype": args.dtype, "max_tokens": args.max_tokens, "draft_args": args.draft_arg,
            "machine": machine_info(args.threads, "PASSIVE"), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "identical": identical, "summary": summary, "hybrid_blocks": hybrid_blocks,
            "runs": [{k: v for k, v in r.items() if k != "tokens"} for r in runs]}, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
