"""The hybrid draft on the Qwen2.5-Coder pair: model, suffix and hybrid side by side, interleaved, per workload.

One stack per method (the 1.5B verifies in each; model and hybrid draft with the 0.5B), all up at once. For each prompt
of each workload (bench/workloads/<name>.jsonl, greedy; the first --per-workload of each): speculation off (k = 0, on
the last method's stack) once and each method at adaptive k, their order rotating from prompt to prompt so that none,
off included, always runs first after another stack's request (`slot` in each row); every output must be the plain
run's; --passes repeats it all. Prints a JSON line per run and, at the end, each method's tokens/s summed over the
prompts, its ratio to off, per workload (and again without the stacks' first request, "warm"), the hybrid's ratios to
the other methods, each also as the geometric mean of its per-prompt ratios with a 95% interval (`bench.core.intervals`:
on these machines two identical stacks differ by more than most of the differences measured here; `model-twin` measures
that), the hybrid's blocks by side (from the draft's /metrics) and each stack's rounds without a block by reason (from
the verifier's); --out writes it all with the machine (CPU model and flags). `hybrid-priced` is a second hybrid stack
whose verifier sets the threshold (--hybrid-threshold priced), so that both rules run interleaved in one run. The
machine may be shared: quote the figures with that. To set a method's ratio to off against the advisor's prediction,
predict on the same prompts: `python -m bench advise ... --prompts bench/workloads/<name>.jsonl --max-prompts N`, with N
this run's --per-workload (a workload's first N either way).

    python -m tools.hybrid_check --model .cache/models/qwen2.5-coder-1.5b --draft-model .cache/models/qwen2.5-coder-0.5b \\
        --dtype bfloat16 --workloads code,extraction,sql,chat --out bench/results/pair/hybrid_check.json
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

from bench.core.intervals import ratio_interval
from bench.core.machine import machine_info
from bench.core.workloads import load_workload
from devkit.stack import running_stack, scrape_metrics
from specdec.v1 import gateway_pb2_grpc
from tools.pair_check import cpu, run

METHODS = ("model", "suffix", "hybrid", "hybrid-priced", "hybrid-min4", "model-twin")
# a method's draft (--method) and the flags it adds: hybrid-priced is the hybrid with the verifier's threshold,
# hybrid-min4 the hybrid whose suffix side answers only on a match of 4 tokens or more (the default until it was
# measured against any match, docs/design.md); model-twin a second stack just like model's, so that the run
# measures its own spread: what two identical stacks give apart (an A/A test) bounds what a ratio can tell
DRAFT_METHOD = {"hybrid-priced": "hybrid", "hybrid-min4": "hybrid", "model-twin": "model"}
METHOD_VERIFIER_ARGS = {"hybrid-priced": ["--hybrid-threshold", "priced"]}
METHOD_DRAFT_ARGS = {"hybrid-min4": ["--hybrid-min-suffix", "4"]}
FALLBACK_REASONS = "specdec_fallback_rounds_total"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="target model directory")
    parser.add_argument("--draft-model", required=True, help="the draft model (model and hybrid)")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each verifier")
    parser.add_argument("--workloads", default="code", help="comma-separated names of bench/workloads/*.jsonl")
    parser.add_argument("--per-workload", type=int, default=4, help="the first N prompts of each workload")
    parser.add_argument("--prompts", default="", help="comma-separated prompt ids (default: the first N of each)")
    parser.add_argument("--max-tokens", type=int, default=64, help="cap on each prompt's max_tokens")
    parser.add_argument("--passes", type=int, default=1, help="run every prompt this many times (more pairs, a "
                                                                 "narrower interval)")
    parser.add_argument("--draft-arg", action="append", default=[], help="extra flag for the hybrid's draft")
    parser.add_argument("--verifier-arg", action="append", default=[],
                        help="extra flag for every verifier, e.g. --verifier-arg=--prepack-weights "
                             "--verifier-arg=false (float32 without prepacking: about half the memory a verifier "
                             "holds, so that two stacks fit in 24 GiB)")
    parser.add_argument("--methods", default="model,suffix,hybrid",
                        help="which of model, suffix, hybrid, hybrid-priced (the hybrid with the verifier's "
                             "--hybrid-threshold priced), hybrid-min4 (with --hybrid-min-suffix 4), model-twin (a "
                             "second model stack: the run's own spread) to run")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    methods = tuple(m for m in METHODS if m in args.methods.split(","))
    wanted = [p for p in args.prompts.split(",") if p]
    prompts = []
    for workload in [w for w in args.workloads.split(",") if w]:
        lines = load_workload(workload, max_tokens=args.max_tokens)
        prompts += [p for p in lines if p.id in wanted] if wanted else lines[:args.per_workload]
    print(f"cpu: {cpu()}", flush=True)
    env = {"OMP_WAIT_POLICY": "PASSIVE"}
    verifier = ["--dtype", args.dtype, "--threads", str(args.threads), *args.verifier_arg]
    runs = []
    with tempfile.TemporaryDirectory() as logs, contextlib.ExitStack() as stacks:
        started = time.monotonic()
        services = {method: stacks.enter_context(running_stack(
            args.model, args.draft_model, method=DRAFT_METHOD.get(method, method),
            verifier_args=verifier + METHOD_VERIFIER_ARGS.get(method, []), env=env, timeout_s=900,
            draft_args=(["--dtype", args.dtype] if method != "suffix" else [])
            + (args.draft_arg if method.startswith("hybrid") else []) + METHOD_DRAFT_ARGS.get(method, []),
            log_dir=pathlib.Path(logs)))
            for method in methods}
        print(f"stacks SERVING after {time.monotonic() - started:.0f} s", flush=True)
        stubs = {m: gateway_pb2_grpc.GatewayStub(stacks.enter_context(grpc.insecure_channel(s["gateway"].address)))
                 for m, s in services.items()}
        for method, stub in stubs.items():  # first requests pay for kernels of new shapes: not measured
            run(stub, prompts[0].text, 8, None, chat=False)
        for i, (pass_index, prompt) in enumerate((p, prompt) for p in range(args.passes) for prompt in prompts):
            max_tokens = prompt.max_tokens
            order = run_order(methods, i)
            results = {method: run(stubs[methods[-1]] if method == "off" else stubs[method], prompt.text, max_tokens,
                                   0 if method == "off" else None, chat=False)
                       for method in order}
            plain = results["off"]
            where = {"workload": prompt.workload, "prompt": prompt.id, "pass": pass_index}
            print(json.dumps({**where, "method": "off", "slot": order.index("off"),
                              **{k: v for k, v in plain.items() if k != "tokens"}}), flush=True)
            runs.append({**where, "method": "off", "slot": order.index("off"), **plain, "identical": True})
            for method in methods:
                result = results[method]
                row = {**where, "method": method, "slot": order.index(method),
                       "identical": result["tokens"] == plain["tokens"],
                       "vs_off": round(result["tok_s"] / plain["tok_s"], 3),
                       **{k: v for k, v in result.items() if k != "tokens"}}
                print(json.dumps(row), flush=True)
                runs.append({**row, "tokens": result["tokens"]})
        hybrid_blocks = {method: blocks_by_side(scrape_metrics(services[method]["draft"].metrics_port))
                         for method in methods if method.startswith("hybrid")}
        fallbacks = {method: fallback_reasons(scrape_metrics(services[method]["verifier"].metrics_port))
                     for method in methods}
    summary = {workload: summarize([r for r in runs if r["workload"] == workload], methods)
               for workload in dict.fromkeys(r["workload"] for r in runs)}
    warm = warm_summary(runs, methods, prompts[0].id)
    identical = all(r["identical"] for r in runs)
    print(json.dumps({"summary": summary, "warm": warm, "hybrid_blocks": hybrid_blocks, "fallback_reasons": fallbacks}),
          flush=True)
    print("greedy output identical to k = 0 on every run" if identical else "OUTPUT DIFFERS", flush=True)
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.out).write_text(json.dumps({
            "model": pathlib.Path(args.model).name, "draft_model": pathlib.Path(args.draft_model).name,
            "dtype": args.dtype, "max_tokens": args.max_tokens, "workloads": args.workloads, "passes": args.passes,
            "draft_args": args.draft_arg,
            "verifier_args": args.verifier_arg,
            "machine": machine_info(args.threads, "PASSIVE"), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "identical": identical, "summary": summary, "warm": warm, "hybrid_blocks": hybrid_blocks,
            "fallback_reasons": fallbacks,
            "runs": [{k: v for k, v in r.items() if k != "tokens"} for r in runs]}, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0 if identical else 1


def blocks_by_side(scraped: dict) -> dict[str, float]:
    """A hybrid draft's blocks by the side that drafted them (specdec_draft_hybrid_blocks_total)."""
    return {side: scraped.get(("specdec_draft_hybrid_blocks_total", (("source", side),)), 0.0)
            for side in ("suffix", "model")}


def fallback_reasons(scraped: dict) -> dict[str, float]:
    """A verifier's rounds decoded without a block, by reason (specdec_fallback_rounds_total), warm-up included."""
    return {dict(labels)["reason"]: value for (name, labels), value in scraped.items()
            if name == FALLBACK_REASONS and value}


def run_order(methods: tuple[str, ...], index: int) -> tuple[str, ...]:
    """The order of a prompt's runs: off and the methods, rotated by one from prompt to prompt, so that none of them,
    off included, always runs first after another stack's request (whatever that request leaves behind)."""
    order = ("off", *methods)
    shift = index % len(order)
    return order[shift:] + order[:shift]


def summarize(runs: list[dict], methods: tuple[str, ...]) -> dict:
    """Each method's tokens/s over the runs (total tokens over total seconds), its ratio to off, and the hybrid's
    ratio to each other method run beside it and to the better of model and suffix (where both ran). Run with one of
    them at a time (where two stacks are all that fit), the hybrid's ratio to the better is the smaller of its ratios
    to each, each from one run. model-twin: its ratio to model, two identical stacks apart. Each such ratio also as
    `<name>_interval`: the geometric mean of its per-prompt (and per-pass) ratios, with their 95% interval."""
    summary = {}
    for method in ("off", *methods):
        mine = [r for r in runs if r["method"] == method]
        tokens, seconds = sum(len(r["tokens"]) for r in mine), sum(r["seconds"] for r in mine)
        summary[method] = {"tok_s": round(tokens / seconds, 3), "identical": all(r["identical"] for r in mine)}
    for method in methods:
        summary[method]["vs_off"] = round(summary[method]["tok_s"] / summary["off"]["tok_s"], 3)
    for hybrid in [m for m in methods if m.startswith("hybrid")]:
        for other in [m for m in methods if m != hybrid]:
            summary[hybrid][f"vs_{other}"] = round(summary[hybrid]["tok_s"] / summary[other]["tok_s"], 3)
            summary[hybrid][f"vs_{other}_interval"] = paired_ratio(runs, hybrid, other)
        if {"model", "suffix"} <= set(methods):
            better = max(("model", "suffix"), key=lambda m: summary[m]["tok_s"])
            summary[hybrid]["vs_better"] = round(summary[hybrid]["tok_s"] / summary[better]["tok_s"], 3)
            summary[hybrid]["vs_better_interval"] = paired_ratio(runs, hybrid, better)
    if {"model", "model-twin"} <= set(methods):
        summary["model-twin"]["vs_model"] = round(summary["model-twin"]["tok_s"] / summary["model"]["tok_s"], 3)
        summary["model-twin"]["vs_model_interval"] = paired_ratio(runs, "model-twin", "model")
    return summary


def paired_ratio(runs: list[dict], a: str, b: str) -> dict | None:
    """Method a's speed over b's, per prompt and pass where both ran: their geometric mean and 95% interval."""
    speeds = {(r["prompt"], r.get("pass", 0), r["method"]): len(r["tokens"]) / r["seconds"] for r in runs}
    return ratio_interval([(speed, speeds[(prompt, run_pass, b)]) for (prompt, run_pass, method), speed in speeds.items()
                           if method == a and (prompt, run_pass, b) in speeds])


def warm_summary(runs: list[dict], methods: tuple[str, ...], first_prompt: str) -> dict:
    """`summarize` per workload without the first prompt the stacks served (their first request after the short
    warm-up): a fresh verifier's policy has timed few forwards then and knows neither side's acceptance, and the
    hybrid, with two sides to learn, pays more for that than either alone. A server past its first request runs as
    these do; both figures are kept."""
    later = [r for r in runs if r["prompt"] != first_prompt]
    return {workload: summarize([r for r in later if r["workload"] == workload], methods)
            for workload in dict.fromkeys(r["workload"] for r in later)}


if __name__ == "__main__":
    sys.exit(main())
