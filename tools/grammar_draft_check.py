"""The grammar as a drafter on the extraction workload, with its schema: off, suffix, grammar, grammar + suffix.

One stack per draft, all up at once: suffix with --grammar-draft off, --method grammar, and suffix with the grammar
(the default). For each prompt of bench/workloads/extraction.jsonl (greedy, the workload's schema as a strict JSON
Schema constraint), after one warm-up request per stack (the same on each): speculation off (k = 0) once, then each draft at adaptive k, the drafts' order rotating from
prompt to prompt. Every output must be the plain run's. Prints a JSON line per run and, at the end, each draft's
tokens/s summed over the prompts, its ratio to off, and its draft tokens verified, accepted and forced (of those
verified, the ones the grammar forced); --out writes it all with the machine (CPU model and flags). The machine may
be shared: quote the figures with that.

    python -m tools.grammar_draft_check --model .cache/models/smollm2-135m-instruct --prompts 8 \\
        --out bench/results/grammar_draft_smollm2.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import tempfile
import time

import grpc

from bench.core.machine import machine_info
from bench.core.workloads import workload_path
from devkit.stack import running_stack
from specdec.v1 import common_pb2, gateway_pb2_grpc
from tools import pair_check
from tools.pair_check import cpu

NULLABLE = {"anyOf": [{"type": "string"}, {"type": "null"}]}
# The extraction prompts' schema ("Use exactly this schema and key order"), as a JSON Schema.
SCHEMA = {"type": "object", "properties": {
    "kind": {"enum": ["invoice", "person", "product", "order", "event"]}, "name": {"type": "string"},
    "date": NULLABLE, "amount": {"anyOf": [{"type": "number"}, {"type": "null"}]}, "currency": NULLABLE,
    "city": NULLABLE, "email": NULLABLE},
    "required": ["kind", "name", "date", "amount", "currency", "city", "email"], "additionalProperties": False}
# draft -> (--method, extra draft flags)
DRAFTS = {"suffix": ("suffix", ["--grammar-draft", "off"]), "grammar": ("grammar", []),
          "grammar+suffix": ("suffix", [])}


def run(stub, prompt: str, max_tokens: int, k: int | None) -> dict:
    return pair_check.run(stub, prompt, max_tokens, k,
                          common_pb2.Constraint(json_schema=json.dumps(SCHEMA), strict=True))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="target model directory (its tokenizer for the drafts)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each verifier")
    parser.add_argument("--prompts", type=int, default=8, help="how many of extraction.jsonl's prompts")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    lines = [json.loads(line) for line in workload_path("extraction").read_text().splitlines() if line.strip()]
    prompts = lines[:args.prompts]
    print(f"cpu: {cpu()}", flush=True)
    env = {"OMP_WAIT_POLICY": "PASSIVE"}
    drafts = tuple(DRAFTS)
    runs = []
    with tempfile.TemporaryDirectory() as logs, contextlib.ExitStack() as stacks:
        started = time.monotonic()
        services = {name: stacks.enter_context(running_stack(
            args.model, method=method, verifier_args=["--threads", str(args.threads)], draft_args=flags, env=env,
            timeout_s=600, log_dir=pathlib.Path(logs)))
            for name, (method, flags) in DRAFTS.items()}
        print(f"stacks SERVING after {time.monotonic() - started:.0f} s", flush=True)
        stubs = {name: gateway_pb2_grpc.GatewayStub(stacks.enter_context(grpc.insecure_channel(s["gateway"].address)))
                 for name, s in services.items()}
        for stub in stubs.values():  # the same warm-up on each stack: first forwards, the verifier's compile
            run(stub, "Say hi", 24, 4)  # a fixed k: no evidence for the policy to turn drafting off on
        for i, prompt in enumerate(prompts):
            plain = run(stubs["suffix"], prompt["prompt"], prompt["max_tokens"], 0)
            print(json.dumps({"prompt": prompt["id"], "draft": "off",
                              **{k: v for k, v in plain.items() if k != "tokens"}}), flush=True)
            runs.append({"prompt": prompt["id"], "draft": "off", **plain, "identical": True})
            for name in drafts[i % len(drafts):] + drafts[:i % len(drafts)]:
                result = run(stubs[name], prompt["prompt"], prompt["max_tokens"], None)
                row = {"prompt": prompt["id"], "draft": name, "identical": result["tokens"] == plain["tokens"],
                       "vs_off": round(result["tok_s"] / plain["tok_s"], 3),
                       **{k: v for k, v in result.items() if k != "tokens"}}
                print(json.dumps(row), flush=True)
                runs.append({**row, "tokens": result["tokens"]})
    summary = {}
    for name in ("off", *drafts):
        mine = [r for r in runs if r["draft"] == name]
        tokens, seconds = sum(len(r["tokens"]) for r in mine), sum(r["seconds"] for r in mine)
        drafted, accepted, forced = (sum(r[key] for r in mine) for key in ("drafted", "accepted", "forced"))
        summary[name] = {"tok_s": round(tokens / seconds, 3), "output_tokens": tokens, "drafted": drafted,
                         "accepted": accepted, "forced": forced,
                         "identical": all(r["identical"] for r in mine)}
    for name in drafts:
        summary[name]["vs_off"] = round(summary[name]["tok_s"] / summary["off"]["tok_s"], 3)
    identical = all(r["identical"] for r in runs)
    print(json.dumps({"summary": summary}), flush=True)
    print("greedy output identical to k = 0 on every run" if identical else "OUTPUT DIFFERS", flush=True)
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.out).write_text(json.dumps({
            "model": pathlib.Path(args.model).name, "workload": "extraction", "schema": SCHEMA,
            "machine": machine_info(args.threads, "PASSIVE"), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "identical": identical, "summary": summary,
            "runs": [{k: v for k, v in r.items() if k != "tokens"} for r in runs]}, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
