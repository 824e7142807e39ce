"""A bounded load test of the gateway: N streaming requests, C at a time, over gRPC aio.

    python tools/loadtest.py --addr 127.0.0.1:50051 --requests 256 --concurrency 32 --max-tokens 32 \\
        --pid gateway=1234 --pid verifier=1235 --pid draft=1236 --out bench/results/load_tiny.json

Records latency percentiles (whole request and time to first token), tokens/s,
errors by status code, whether every response was complete (a finish_reason on
the last message and completion_tokens == number of token ids streamed), and the
resident memory (VmRSS) of the given processes before and after. Loopback or a
test cluster only: it sends exactly N requests and stops.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import os
import pathlib
import platform
import sys
import time

import grpc

from specdec.v1 import gateway_pb2, gateway_pb2_grpc

PROMPTS = [
    "Hello", "The quick brown fox", '{"name": "Ada", "age": 36}', "SELECT id FROM users", "def add(a, b):",
    "Speculative decoding", "for i in range(10):", "café 東京 🙂",
]


def rss_mib(pid: int) -> float | None:
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100])."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


async def run(args: argparse.Namespace) -> dict:
    metadata = (("authorization", f"Bearer {args.api_key}"),) if args.api_key else ()
    options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
    if args.tls_ca:
        credentials = grpc.ssl_channel_credentials(
            pathlib.Path(args.tls_ca).read_bytes(),
            pathlib.Path(args.tls_key).read_bytes() if args.tls_key else None,
            pathlib.Path(args.tls_cert).read_bytes() if args.tls_cert else None)
        channel = grpc.aio.secure_channel(args.addr, credentials, options=options)
    else:
        channel = grpc.aio.insecure_channel(args.addr, options=options)
    pids = dict(item.split("=", 1) for item in args.pid)
    rss_before = {name: rss_mib(int(pid)) for name, pid in pids.items()}
    latencies, ttfts, tokens = [], [], []
    errors: collections.Counter = collections.Counter()
    error_examples: dict[str, str] = {}
    incomplete = []
    drafted = accepted = 0
    queue: asyncio.Queue = asyncio.Queue()
    for i in range(args.requests):
        queue.put_nowait(i)

    async with channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        await asyncio.wait_for(channel.channel_ready(), args.timeout)

        async def client() -> None:
            nonlocal drafted, accepted
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                request = gateway_pb2.GenerateRequest(prompt=PROMPTS[i % len(PROMPTS)], max_tokens=args.max_tokens,
                                                      temperature=args.temperature, seed=i)
                started = time.perf_counter()
                first, ids, last = None, 0, None
                try:
                    async for piece in stub.GenerateStream(request, timeout=args.timeout, metadata=metadata):
                        if first is None and piece.token_ids:
                            first = time.perf_counter() - started
                        ids += len(piece.token_ids)
                        last = piece
                except grpc.aio.AioRpcError as exc:
                    errors[exc.code().name] += 1
                    error_examples.setdefault(exc.code().name, exc.details() or "")
                    continue
                latencies.append(time.perf_counter() - started)
                if first is not None:
                    ttfts.append(first)
                tokens.append(ids)
                if last is None or not last.finish_reason or last.usage.completion_tokens != ids or ids < 1:
                    incomplete.append(i)
                else:
                    drafted += last.speculation.num_draft_tokens
                    accepted += last.speculation.num_accepted_tokens

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(args.concurrency)))
        wall = time.perf_counter() - started
    rss_after = {name: rss_mib(int(pid)) for name, pid in pids.items()}

    def ms(value):
        return None if value is None else round(value * 1000, 1)

    return {
        "requests": args.requests, "concurrency": args.concurrency, "max_tokens": args.max_tokens,
        "temperature": args.temperature, "ok": len(latencies), "errors": dict(errors),
        "error_examples": error_examples, "incomplete": len(incomplete),
        "all_complete": not incomplete and not errors,
        "wall_s": round(wall, 2), "completion_tokens": sum(tokens),
        "tokens_per_s": round(sum(tokens) / wall, 1) if wall else None,
        "requests_per_s": round(len(latencies) / wall, 2) if wall else None,
        "latency_ms": {"p50": ms(percentile(latencies, 50)), "p90": ms(percentile(latencies, 90)),
                       "p99": ms(percentile(latencies, 99)), "max": ms(max(latencies, default=None))},
        "ttft_ms": {"p50": ms(percentile(ttfts, 50)), "p99": ms(percentile(ttfts, 99))},
        "acceptance_rate": round(accepted / drafted, 3) if drafted else None,
        "rss_mib": {name: {"before": rss_before[name], "after": rss_after[name]} for name in pids},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--addr", default="127.0.0.1:50051", help="gateway HOST:PORT")
    parser.add_argument("--requests", type=int, default=256, help="requests in all (N)")
    parser.add_argument("--concurrency", type=int, default=32, help="streaming clients at once (C)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--timeout", type=float, default=120.0, help="deadline of each request, seconds")
    parser.add_argument("--api-key", default="")
    parser.add_argument("--tls-ca", default="", help="PEM CA of a TLS gateway")
    parser.add_argument("--tls-cert", default="", help="client certificate, for a gateway that requires one")
    parser.add_argument("--tls-key", default="")
    parser.add_argument("--pid", action="append", default=[], metavar="NAME=PID", help="process to measure RSS of")
    parser.add_argument("--out", default="", help="write the JSON result here too")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.requests < 1 or args.concurrency < 1:
        print("--requests and --concurrency must be >= 1", file=sys.stderr)
        return 2
    result = asyncio.run(run(args))
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.out).write_text(text + "\n")
    return 0 if result["all_complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
