"""Structured outputs, exact under speculation and valid, on either engine: extraction prompts with their schema.

One stack (the suffix draft with the grammar drafter, the default; --engine transformers or vllm). For each of the
first --prompts prompts of bench/workloads/extraction.jsonl, greedy, the workload's schema as a strict JSON Schema
constraint: speculation off (k = 0), then adaptive k and each fixed --k; every output must be the k = 0 output,
token for token. Then the same prompt without the constraint at k = 0. Each output (constrained k = 0, and
unconstrained) is parsed as one JSON value (the whole text, stripped) and validated against the schema with the
`jsonschema` package: the validity share with the constraint and without. The prompts show the schema and one
worked example; --without-example drops the example (a harder test of the unconstrained model). Prints a JSON line per prompt and a
summary; --out writes it all with the machine (CPU model and flags). Exit status 1 when any output differs.

    python -m tools.grammar_identity_check --model .cache/models/smollm2-135m-instruct --engine transformers \\
        --prompts 20 --out bench/results/grammar/identity_transformers.json
    python -m tools.grammar_identity_check --model .cache/models/smollm2-135m-instruct --engine vllm \\
        --prompts 20 --out bench/results/grammar/identity_vllm.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time

import grpc
import jsonschema

from bench.core.machine import machine_info
from bench.core.methods import add_stack_options, stack_kwargs
from bench.core.workloads import workload_path
from devkit.stack import running_stack
from specdec.modeling.models import load_tokenizer
from specdec.v1 import common_pb2, gateway_pb2_grpc
from tools import pair_check
from tools.grammar_draft_check import SCHEMA

VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
CONSTRAINT = common_pb2.Constraint(json_schema=json.dumps(SCHEMA), strict=True)


def validity(text: str) -> dict:
    """Whether the whole output is one JSON value, and whether that value satisfies the schema."""
    try:
        value = json.loads(text.strip())
    except json.JSONDecodeError:
        return {"parses": False, "valid": False}
    return {"parses": True, "valid": VALIDATOR.is_valid(value)}


def without_example(prompt: str) -> str:
    """The prompt with its "Example:" paragraph (one record and its JSON) removed."""
    start = prompt.index("Example:\n")
    return prompt[:start] + prompt[prompt.index("Record:", prompt.index("\n\n", start)):]


def stats(result: dict) -> dict:
    return {key: result[key] for key in ("k", "seconds", "tok_s", "drafted", "accepted", "forced")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_stack_options(parser, repeats=None, max_tokens=0)
    parser.set_defaults(dtype="float32", threads=1)
    parser.add_argument("--prompts", type=int, default=20, help="how many of extraction.jsonl's prompts")
    parser.add_argument("--k", type=int, nargs="*", default=[4], help="fixed block sizes to run besides adaptive")
    parser.add_argument("--without-example", action="store_true", help="drop each prompt's worked example")
    args = parser.parse_args(argv)
    lines = [json.loads(line) for line in workload_path("extraction").read_text().splitlines() if line.strip()]
    prompts = lines[:args.prompts]
    if args.without_example:
        prompts = [{**p, "prompt": without_example(p["prompt"])} for p in prompts]
    tokenizer = load_tokenizer(str(args.model))
    print(f"cpu: {pair_check.cpu()}", flush=True)
    machine = machine_info(args.threads, "PASSIVE")  # at the start: its load average is the run's
    rows = []
    with tempfile.TemporaryDirectory() as logs:
        started = time.monotonic()
        kwargs = {**stack_kwargs(args), "method": "suffix"}
        with running_stack(args.model, log_dir=pathlib.Path(logs), **kwargs) as services, \
                grpc.insecure_channel(services["gateway"].address) as channel:
            print(f"stack ({args.engine}) SERVING after {time.monotonic() - started:.0f} s", flush=True)
            stub = gateway_pb2_grpc.GatewayStub(channel)
            pair_check.run(stub, "Say hi", 24, 4, CONSTRAINT)  # warm-up: first forwards, the schema's compiles
            for prompt in prompts:
                max_tokens = args.max_tokens or prompt["max_tokens"]
                plain = pair_check.run(stub, prompt["prompt"], max_tokens, 0, CONSTRAINT)
                fast = [pair_check.run(stub, prompt["prompt"], max_tokens, k, CONSTRAINT) for k in [None, *args.k]]
                free = pair_check.run(stub, prompt["prompt"], max_tokens, 0)
                text = tokenizer.decode(plain["tokens"], skip_special_tokens=True)
                free_text = tokenizer.decode(free["tokens"], skip_special_tokens=True)
                row = {"prompt": prompt["id"], "max_tokens": max_tokens, "output_tokens": len(plain["tokens"]),
                       "identical": all(f["tokens"] == plain["tokens"] for f in fast),
                       "constrained": validity(text), "unconstrained": validity(free_text),
                       "off": stats(plain), "speculation": [stats(f) for f in fast],
                       "text": text, "unconstrained_text": free_text}
                print(json.dumps({k: v for k, v in row.items() if not k.endswith("text")}), flush=True)
                rows.append(row)
    runs = [s for row in rows for s in row["speculation"]]
    summary = {
        "prompts": len(rows), "identical": sum(r["identical"] for r in rows),
        "constrained_parses": sum(r["constrained"]["parses"] for r in rows),
        "constrained_valid": sum(r["constrained"]["valid"] for r in rows),
        "unconstrained_parses": sum(r["unconstrained"]["parses"] for r in rows),
        "unconstrained_valid": sum(r["unconstrained"]["valid"] for r in rows),
        "output_tokens": sum(r["output_tokens"] for r in rows),
        "drafted": sum(s["drafted"] for s in runs), "accepted": sum(s["accepted"] for s in runs),
        "forced": sum(s["forced"] for s in runs)}
    for k in ["adaptive", *args.k]:
        mine = [s for s in runs if s["k"] == k]
        summary[f"tok_s_k_{k}"] = round(summary["output_tokens"] / sum(s["seconds"] for s in mine), 2)
    summary["tok_s_off"] = round(summary["output_tokens"] / sum(r["off"]["seconds"] for r in rows), 2)
    print(json.dumps({"summary": summary}), flush=True)
    identical = summary["identical"] == len(rows)
    print(f"{args.engine}: greedy output with the schema identical to k = 0 on {summary['identical']} of {len(rows)} "
          f"prompts (adaptive and k = {args.k}); valid against the schema: {summary['constrained_valid']} of "
          f"{len(rows)} with the constraint, {summary['unconstrained_valid']} of {len(rows)} without "
          f"({summary['unconstrained_parses']} parse as JSON)", flush=True)
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.out).write_text(json.dumps({
            "model": pathlib.Path(args.model).name, "engine": args.engine, "dtype": args.dtype, "workload": "extraction",
            "without_example": args.without_example,
            "draft": "suffix + grammar (the default)", "k": ["adaptive", *args.k], "schema": SCHEMA,
            "machine": machine,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "summary": summary, "rows": rows},
            indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {args.out}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
