"""The Qwen2.5-Coder pair through the real stack: the 1.5B verifies, the 0.5B drafts (`--method model`), or the
suffix, n-gram or hybrid draft; on the transformers or the vLLM engine.

For each prompt, greedy: speculation off (k = 0, the verifier's plain decoding), then adaptive k, then each fixed
--k; the tokens of every run must be the plain run's. Prints, per run, tokens/s, the ratio to off, the acceptance
rate, the tokens per drafted round and the rounds that fell back (timeouts among them, from the verifier's log),
then the CPU's model and SIMD flags; --out also writes them as JSON. Exit status 1 when any output differs. The
machine may be shared: quote the figures with that. Identity is exact in float32; in bfloat16 a block's forward
rounds differently from a one-token step, so a rare divergence is the target's rounding (docs/numerics.md).

    python tools/pair_check.py --model .cache/models/qwen2.5-coder-1.5b --draft-model .cache/models/qwen2.5-coder-0.5b
    python tools/pair_check.py --model ... --draft-model ... --engine vllm --method suffix --prompts 10 --k
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

import grpc

from specdec.decoding.chat_format import chatml
from devkit.stack import running_stack
from specdec.v1 import gateway_pb2, gateway_pb2_grpc
from bench.core.machine import FLAGS_THAT_MATTER, cpu_model_and_flags, machine_info
from bench.core.methods import add_stack_options, stack_kwargs
from draft_service.config import MODEL_METHODS

PROMPTS = [
    "Write a Python function `is_prime(n)` that returns True if n is prime. Code only.",
    "Write a Python function that returns the n-th Fibonacci number iteratively. Code only.",
    "Write a SQL query that returns the 5 customers with the highest total order amount, from tables "
    "customers(id, name) and orders(id, customer_id, amount). Code only.",
    "Write a JavaScript function that removes duplicate values from an array. Code only.",
    "Write a Python function that parses an ISO date string `YYYY-MM-DD` into a (year, month, day) tuple of ints. "
    "Code only.",
    "Write a bash one-liner that counts the lines of every `.py` file under the current directory. Code only.",
    'Return a JSON object with the keys "name", "age" and "city" for a 34-year-old named Ada who lives in Paris. '
    "JSON only.",
    "Write a Python class `Stack` with push, pop and peek methods backed by a list. Code only.",
    "Write a SQL query that returns each department's average salary from employees(id, name, department, "
    "salary), highest first. Code only.",
    "Write a Python function that reverses the words of a sentence, keeping single spaces. Code only.",
]
def cpu() -> str:
    """The CPU's model name, core count and the flags that change speculation's figures."""
    model, flags = cpu_model_and_flags()
    return f"{model}, {os.cpu_count()} cores, flags: {' '.join(f for f in FLAGS_THAT_MATTER if f in flags)}"


def run(stub, prompt: str, max_tokens: int, k: int | None, constraint=None, chat: bool = True) -> dict:
    """One greedy request; constraint: a common_pb2.Constraint (structured outputs), or None; chat=False: the
    prompt is ChatML already (a workload's Prompt.text), sent as is."""
    request = gateway_pb2.GenerateRequest(prompt=chatml(prompt) if chat else prompt, max_tokens=max_tokens,
                                          temperature=0.0,
                                          constraint=constraint)
    if k is not None:
        request.num_speculative_tokens = k
    started = time.perf_counter()
    response = stub.Generate(request, timeout=1800)
    seconds = time.perf_counter() - started
    stats = response.speculation
    return {"k": "adaptive" if k is None else k, "tokens": list(response.token_ids), "seconds": round(seconds, 2),
            "tok_s": round(len(response.token_ids) / seconds, 3), "acceptance": round(stats.acceptance_rate, 3),
            "per_round": round(stats.mean_accepted_length, 2), "drafts": stats.num_drafts,
            "fallback_rounds": stats.num_fallback_rounds, "rounds": stats.num_rounds,
            "drafted": stats.num_draft_tokens, "accepted": stats.num_accepted_tokens, "forced": stats.num_forced_tokens}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_stack_options(parser, repeats=None)
    parser.set_defaults(dtype="float32")
    parser.add_argument("--method", default="model", choices=["model", "suffix", "ngram", "hybrid"],
                        help="the draft method (model and hybrid run --draft-model)")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help="how many of the built-in prompts")
    parser.add_argument("--k", type=int, nargs="*", default=[4], help="fixed block sizes to run besides adaptive")
    parser.add_argument("--verifier-arg", action="append", default=[], help="extra verifier flag (repeatable)")
    parser.add_argument("--draft-arg", action="append", default=[],
                        help="extra draft-service flag (repeatable), e.g. --draft-arg=--propose-ahead --draft-arg=always")
    args = parser.parse_args(argv)
    if args.method in MODEL_METHODS and not args.draft_model:
        parser.error(f"--method {args.method} needs --draft-model")
    print(f"cpu: {cpu()}", flush=True)
    runs = []
    with tempfile.TemporaryDirectory() as logs:
        log_dir = pathlib.Path(logs)
        started = time.monotonic()
        kwargs = stack_kwargs(args, args.verifier_arg)
        kwargs["draft_args"] = [*kwargs["draft_args"], *args.draft_arg]
        with running_stack(args.model, log_dir=log_dir, **kwargs) as services:
            print(f"stack SERVING after {time.monotonic() - started:.0f} s", flush=True)
            with grpc.insecure_channel(services["gateway"].address) as channel:
                stub = gateway_pb2_grpc.GatewayStub(channel)
                for prompt in PROMPTS[:args.prompts]:
                    plain = run(stub, prompt, args.max_tokens, 0)
                    print(json.dumps({"prompt": prompt[:40], **{k: v for k, v in plain.items() if k != "tokens"}}),
                          flush=True)
                    for k in [None, *args.k]:
                        result = run(stub, prompt, args.max_tokens, k)
                        row = {"prompt": prompt[:40], "identical": result["tokens"] == plain["tokens"],
                               "vs_off": round(result["tok_s"] / plain["tok_s"], 3),
                               **{k: v for k, v in result.items() if k != "tokens"}}
                        runs.append({**row, "off_tok_s": plain["tok_s"]})
                        print(json.dumps(row), flush=True)
            log = "".join(path.read_text() for path in log_dir.glob("verifier_service-*.log"))
            timeouts = log.count("no block within") + log.count("TimeoutError")  # this code's message, and before
            print(f"verifier log: {timeouts} timed-out rounds, "
                  f"{log.count('decoding without the draft')} rounds without the draft", flush=True)
    identical = all(r["identical"] for r in runs)
    print(f"greedy output identical to k = 0 on {sum(r['identical'] for r in runs)} of {len(runs)} runs", flush=True)
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.out).write_text(json.dumps({
            "model": pathlib.Path(args.model).name, "draft_model": pathlib.Path(args.draft_model).name
            if args.draft_model else "", "method": args.method, "draft_args": args.draft_arg, "engine": args.engine, "dtype": args.dtype,
            "max_tokens": args.max_tokens, "machine": machine_info(args.threads, "PASSIVE"),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "identical": identical,
            "timed_out_rounds": timeouts, "runs": runs}, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
