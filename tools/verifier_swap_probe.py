"""Swap the verifier under a running gateway for another model with the same tokenizer; print the gateway's health.

    python -m tools.verifier_swap_probe [--model-a DIR --model-b DIR]

Without models it builds the tiny seeded pair (devkit/testing.py: one tokenizer, other weights). It starts a
verifier on A and a gateway, replaces the verifier by one on B on the same port, waits for the gateway's watch
(--peer-check-s 0.5), and prints what `python -m specdec.runtime.health_probe` and HTTP /health say, then puts A back.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from devkit.stack import Service, stop_all, wait_serving

ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def verifier(model: str, port: int, log_dir: pathlib.Path) -> Service:
    service = Service("verifier_service", ["--model", model, "--threads", "1", "--grace-s", "1"], ENV, log_dir, port)
    wait_serving(service.address, 120, service.process)
    return service


def health(gateway: Service) -> str:
    """Both front doors, as a probe sees them."""
    probe = subprocess.run([sys.executable, "-m", "specdec.runtime.health_probe", "--addr", gateway.address],
                           capture_output=True, text=True, timeout=30)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{gateway.http_port}/health", timeout=10) as reply:
            http = f"{reply.status} {reply.read().decode()}"
    except urllib.error.HTTPError as exc:
        http = f"{exc.code} {exc.read().decode()}"
    return f"$ python -m specdec.runtime.health_probe --addr {gateway.address}  (exit {probe.returncode})\n" \
           f"{(probe.stdout + probe.stderr).strip()}\n$ curl http://127.0.0.1:{gateway.http_port}/health\n{http}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-a", help="the model the gateway starts with")
    parser.add_argument("--model-b", help="another model with the same tokenizer")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = pathlib.Path(tmp)
        if not (args.model_a and args.model_b):
            from devkit.testing import build_tiny_pair

            args.model_a, args.model_b = map(str, build_tiny_pair(log_dir))
        services = [verifier(args.model_a, 0, log_dir)]
        try:
            gateway = Service("gateway", ["--model", args.model_a, "--verifier", services[0].address,
                                          "--peer-check-s", "0.5", "--grace-s", "1"], ENV, log_dir)
            services.append(gateway)
            wait_serving(gateway.address, 120, gateway.process)
            print(f"--- verifier on {args.model_a}\n{health(gateway)}")
            port = services[0].port
            services[0].stop()
            services[0] = verifier(args.model_b, port, log_dir)
            time.sleep(3)  # the watch checks at the reconnect and every 0.5 s
            print(f"--- verifier replaced by {args.model_b} (same tokenizer)\n{health(gateway)}")
            services[0].stop()
            services[0] = verifier(args.model_a, port, log_dir)
            time.sleep(3)
            print(f"--- verifier on {args.model_a} again\n{health(gateway)}")
        finally:
            stop_all(services)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    sys.exit(main())
