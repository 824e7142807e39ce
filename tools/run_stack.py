"""`make run`: start draft, verifier and gateway on the real model, send a demo request, run until Ctrl-C.

Ports: gateway 50051 (HTTP 8000), verifier 50052, draft 50053; metrics on 9101-9103.
Logs go to .cache/logs/. Ctrl-C shuts down gracefully: each service reports
NOT_SERVING, drains in-flight calls, then exits.
"""

from __future__ import annotations

import argparse
import pathlib
import signal
import sys
import time

import grpc

from specdec.decoding.chat_format import chatml
from devkit.stack import running_stack
from draft_service.config import MODEL_METHODS
from specdec.v1 import gateway_pb2, gateway_pb2_grpc

ROOT = pathlib.Path(__file__).resolve().parent.parent

# What the product is for: output that repeats what the service has seen (one JSON schema, a repeat).
DEMO = [
    ("extract a record", 'Extract the person as JSON with keys "name", "city", "job". '
                         "Text: Maria Lopez lives in Seville and works as a nurse."),
    ("the same request again", 'Extract the person as JSON with keys "name", "city", "job". '
                               "Text: Maria Lopez lives in Seville and works as a nurse."),
    ("another record, same schema", 'Extract the person as JSON with keys "name", "city", "job". '
                                    "Text: Tom Berg lives in Oslo and works as a pilot."),
]
# What a code model's draft is for (`make run-pair`): code, where a draft of the same family agrees most.
DEMO_CODE = [
    ("a Python function", "Write a Python function `is_prime(n)` that returns True if n is prime. Code only."),
    ("a SQL query", "Write a SQL query that returns the 5 customers with the highest total order amount, from "
                    "tables customers(id, name) and orders(id, customer_id, amount). Code only."),
    ("a record as JSON", 'Extract the person as JSON with keys "name", "city", "job". '
                         "Text: Maria Lopez lives in Seville and works as a nurse."),
]
DEMOS = {"json": DEMO, "code": DEMO_CODE}
PORTS = {"gateway": (50051, 9101), "verifier": (50052, 9102), "draft": (50053, 9103), "gateway_http": 8000}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="target model directory")
    parser.add_argument("--draft-model", default="", help="draft model dir (method=model); default: suffix decoding")
    parser.add_argument("--method", default="", choices=["", "model", "suffix", "hybrid"],
                        help="the draft method (default: model with --draft-model, else suffix; hybrid needs "
                             "--draft-model)")
    # float32: exact, and on the 2-core CI CPU (torch 2.13) faster than bfloat16 for multi-token passes
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--no-demo", action="store_true")
    parser.add_argument("--demo", default="json", choices=list(DEMOS), help="the demo's requests")
    args = parser.parse_args()
    method = args.method or ("model" if args.draft_model else "suffix")
    if method in MODEL_METHODS and not args.draft_model:
        parser.error(f"--method {method} needs --draft-model")
    log_dir = ROOT / ".cache" / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"==> starting draft ({method}), verifier ({args.dtype}) and gateway; logs in {log_dir}", flush=True)
    started = time.monotonic()
    try:
        with running_stack(args.model, args.draft_model or None, method=method, log_dir=log_dir, ports=PORTS,
                           verifier_args=["--dtype", args.dtype],
                           draft_args=["--dtype", args.dtype] if method in MODEL_METHODS else []) as services:
            # Block the signals only now: children started earlier must not inherit the mask.
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            print(f"==> all three services SERVING after {time.monotonic() - started:.1f} s", flush=True)
            if not args.no_demo:
                demo(services["gateway"].address, DEMOS[args.demo])
            print("\n==> stack is up: gateway localhost:50051 (try `python -m gateway.cli --chat 'Hi'`), "
                  "metrics :9101-9103, OpenAI-compatible HTTP on :8000. Ctrl-C to stop.", flush=True)
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
            print("\n==> stopping: NOT_SERVING, draining, exiting", flush=True)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\n==> interrupted during start-up; stopped", flush=True)
        return 130
    print("==> stopped", flush=True)
    return 0


def demo(address: str, requests: list[tuple[str, str]] = DEMO) -> None:
    """Each request without speculation, then with it (the draft learns from the outputs it sees)."""
    print("==> demo: each request decoded plainly (k=0), then with speculation\n", flush=True)
    with grpc.insecure_channel(address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        print(f"{'request':30} {'off tok/s':>10} {'spec tok/s':>11} {'speedup':>8} {'acceptance':>11} "
              f"{'accepted/round':>15}")
        for label, prompt in requests:
            rates = []
            for k in (0, None):
                request = gateway_pb2.GenerateRequest(prompt=chatml(prompt), max_tokens=64, temperature=0.0)
                if k is not None:
                    request.num_speculative_tokens = k
                started = time.perf_counter()
                response = stub.Generate(request, timeout=300)
                rates.append(response.usage.completion_tokens / (time.perf_counter() - started))
            stats = response.speculation
            print(f"{label:30} {rates[0]:10.1f} {rates[1]:11.1f} {rates[1] / rates[0]:7.2f}x "
                  f"{stats.acceptance_rate:11.2f} {stats.mean_accepted_length:15.2f}", flush=True)
        print(f"\nlast answer: {response.text.strip()[:200]}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
