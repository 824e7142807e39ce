"""The Qwen2.5-Coder pair through the real stack: the 1.5B verifies, the 0.5B drafts (`--method model`).

For each prompt, greedy: speculation off (k = 0, the verifier's plain decoding), then adaptive k, then each fixed
--k; the tokens of every run must be the plain run's. Prints, per run, tokens/s, the ratio to off, the acceptance
rate, the tokens per drafted round and the rounds that fell back (timeouts among them, from the verifier's log),
then the CPU's model and SIMD flags. The machine may be shared: quote the figures with that.

    python tools/pair_check.py --target .cache/models/qwen2.5-coder-1.5b --draft .cache/models/qwen2.5-coder-0.5b
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
from bench.core.machine import FLAGS_THAT_MATTER, cpu_model_and_flags

PROMPTS = [
    "Write a Python function `is_prime(n)` that returns True if n is prime. Code only.",
    "Write a Python function that returns the n-th Fibonacci number iteratively. Code only.",
    "Write a SQL query that returns the 5 customers with the highest total order amount, from tables "
    "customers(id, name) and orders(id, customer_id, amount). Code only.",
    "Write a JavaScript function that removes duplicate values from an array. Code only.",
]
def cpu() -> str:
    """The CPU's model name, core count and the flags that change speculation's figures."""
    model, flags = cpu_model_and_flags()
    return f"{model}, {os.cpu_count()} cores, flags: {' '.join(f for f in FLAGS_THAT_MATTER if f in flags)}"


def run(stub, prompt: str, max_tokens: int, k: int | None, constraint=None) -> dict:
    """One greedy request; constraint: a common_pb2.Constraint (structured outputs), or None."""
    request = gateway_pb2.GenerateRequest(prompt=chatml(prompt), max_tokens=max_tokens, temperature=0.0,
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
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help="how many of the built-in prompts")
    parser.add_argument("--k", type=int, nargs="*", default=[4], help="fixed block sizes to run besides adaptive")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="the target's and the draft's dtype (bfloat16 pays where the CPU has avx512_bf16 or AMX)")
    parser.add_argument("--verifier-arg", action="append", default=[], help="extra verifier flag (repeatable)")
    args = parser.parse_args(argv)
    print(f"cpu: {cpu()}", flush=True)
    with tempfile.TemporaryDirectory() as logs:
        log_dir = pathlib.Path(logs)
        started = time.monotonic()
        with running_stack(args.target, args.draft, method="model", log_dir=log_dir, timeout_s=900,
                           verifier_args=["--dtype", args.dtype, *args.verifier_arg],
                           draft_args=["--dtype", args.dtype]) as services:
            print(f"stack SERVING after {time.monotonic() - started:.0f} s", flush=True)
            identical = True
            with grpc.insecure_channel(services["gateway"].address) as channel:
                stub = gateway_pb2_grpc.GatewayStub(channel)
                for prompt in PROMPTS[:args.prompts]:
                    plain = run(stub, prompt, args.max_tokens, 0)
                    print(json.dumps({"prompt": prompt[:40], **{k: v for k, v in plain.items() if k != "tokens"}}),
                          flush=True)
                    for k in [None, *args.k]:
                        result = run(stub, prompt, args.max_tokens, k)
                        same = result["tokens"] == plain["tokens"]
                        identical &= same
                        print(json.dumps({"prompt": prompt[:40], "identical": same,
                                          "vs_off": round(result["tok_s"] / plain["tok_s"], 3),
                                          **{k: v for k, v in result.items() if k != "tokens"}}), flush=True)
            log = "".join(path.read_text() for path in log_dir.glob("verifier_service-*.log"))
            timeouts = log.count("no block within") + log.count("TimeoutError")  # this code's message, and before
            print(f"verifier log: {timeouts} timed-out rounds, "
                  f"{log.count('decoding without the draft')} rounds without the draft", flush=True)
    print("greedy output identical to k = 0 on every run" if identical else "OUTPUT DIFFERS", flush=True)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
