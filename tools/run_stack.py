"""`make run`: start draft, verifier and gateway on the real model, send a demo request, run until Ctrl-C.

Ports: gateway 50051, verifier 50052, draft 50053; metrics on 9101-9103.
Logs go to .cache/logs/. Ctrl-C shuts down gracefully: each service reports
NOT_SERVING, drains in-flight calls, then exits.
"""

from __future__ import annotations

import argparse
import pathlib
import signal
import sys
import time

from gateway import cli
from specdec.stack import running_stack

ROOT = pathlib.Path(__file__).resolve().parent.parent

DEMO_PROMPT = "Give three short tips for writing clear Python code."
PORTS = {"gateway": (50051, 9101), "verifier": (50052, 9102), "draft": (50053, 9103)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="target model directory")
    parser.add_argument("--draft-model", default="", help="draft model dir (method=model); default: n-gram")
    # float32: exact, and on the 2-core CI CPU (torch 2.13) faster than bfloat16 for multi-token passes
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--no-demo", action="store_true")
    args = parser.parse_args()
    method = "model" if args.draft_model else "ngram"
    log_dir = ROOT / ".cache" / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"==> starting draft ({method}), verifier ({args.dtype}) and gateway; logs in {log_dir}", flush=True)
    started = time.monotonic()
    try:
        with running_stack(args.model, args.draft_model or None, method=method, log_dir=log_dir, ports=PORTS,
                           verifier_args=["--dtype", args.dtype],
                           draft_args=["--dtype", args.dtype] if method == "model" else []) as services:
            # Block the signals only now: children started earlier must not inherit the mask.
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            print(f"==> all three services SERVING after {time.monotonic() - started:.1f} s", flush=True)
            if not args.no_demo:
                print(f"==> demo request: {DEMO_PROMPT!r}\n", flush=True)
                cli.main([DEMO_PROMPT, "--chat", "--max-tokens", "96", "--addr", services["gateway"].address])
            print("\n==> stack is up: gateway localhost:50051 (try `python -m gateway.cli --chat 'Hi'`), "
                  "metrics :9101-9103. Ctrl-C to stop.", flush=True)
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


if __name__ == "__main__":
    sys.exit(main())
