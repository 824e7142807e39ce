"""Kill a verifier mid-stream under one gateway; print what the clients saw (issue 35's measurement).

    python -m tools.failover_probe [--model DIR] [--verifiers 3] [--streams 60] [--max-tokens 48] [--out FILE]

Starts a draft, N verifiers and one gateway over them (`--verifier A,B,C`; the tiny seeded models unless
--model), runs the greedy streams once undisturbed (the reference, and the warm-up), then again, and
`kill -9`s one verifier once every stream has a quarter of its tokens. Prints one JSON object: streams
completed, outputs identical to the undisturbed run, requests the gateway resumed (its
specdec_gateway_resumes counter), and the added latency of a resume, p50 and max: for each resumed request,
from the failure to the first token the next verifier sent (the gateway logs it per request). The client
side is there too: each stream's longest wait between two messages, undisturbed and disturbed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import pathlib
import re
import sys
import tempfile
import threading
import time

import grpc

from devkit.stack import running_stack, scrape_metrics
from specdec.v1 import gateway_pb2, gateway_pb2_grpc

ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
# Prompts that differ from their first token, so every stream has an output of its own.
SEEDS = ["The quick brown fox", "def add(a, b):", "SELECT id, name FROM", "for i in range(10):", "Speculative decoding",
         '{"name": "Ada",', "Hello", "naïve café", "return a + b", "ORDER BY name;"]
SEEDED_TEMPERATURE = 0.8
RESUMED_LOG = re.compile(r"resumed on \S+, first token (\d+) ms after the failure")


def prompts(n: int) -> list[str]:
    return [f"{SEEDS[i % len(SEEDS)]} {i}" for i in range(n)]


@dataclasses.dataclass
class Stream:
    """What one client saw: token ids, text, finish reason, message arrival times (time.monotonic), error."""

    token_ids: list[int] = dataclasses.field(default_factory=list)
    text: str = ""
    finish_reason: int = 0
    arrivals: list[float] = dataclasses.field(default_factory=list)
    error: str = ""

    @property
    def longest_wait_s(self) -> float:
        return max((b - a for a, b in zip(self.arrivals, self.arrivals[1:])), default=0.0)


def run_streams(address: str, texts: list[str], max_tokens: int,
                when_all_have: tuple[int, callable] | None = None, timeout_s: float = 300.0,
                seeds: list[int | None] | None = None) -> list[Stream]:
    """One GenerateStream per prompt, all at once: greedy, or where seeds[i] is set, sampled at temperature
    SEEDED_TEMPERATURE with that seed. when_all_have=(n, action): call action() once every stream has n tokens
    (or has ended)."""
    streams = [Stream() for _ in texts]
    progressed = threading.Condition()
    channel = grpc.insecure_channel(address, options=[("grpc.max_concurrent_streams", 1000)])
    stub = gateway_pb2_grpc.GatewayStub(channel)

    def run(i: int) -> None:
        stream = streams[i]
        request = gateway_pb2.GenerateRequest(prompt=texts[i], max_tokens=max_tokens, temperature=0.0)
        if seeds is not None and seeds[i] is not None:
            request.temperature, request.seed = SEEDED_TEMPERATURE, seeds[i]
        try:
            for message in stub.GenerateStream(request, timeout=timeout_s):
                with progressed:
                    stream.arrivals.append(time.monotonic())
                    stream.token_ids.extend(message.token_ids)
                    stream.text += message.text
                    stream.finish_reason = message.finish_reason or stream.finish_reason
                    progressed.notify_all()
        except grpc.RpcError as exc:
            stream.error = f"{exc.code().name}: {exc.details()}"
        finally:
            with progressed:
                stream.arrivals.append(stream.arrivals[-1] if stream.arrivals else time.monotonic())
                stream.finish_reason = stream.finish_reason or -1  # ended, one way or another
                progressed.notify_all()

    with concurrent.futures.ThreadPoolExecutor(len(texts)) as pool:
        futures = [pool.submit(run, i) for i in range(len(texts))]
        if when_all_have is not None:
            need, action = when_all_have
            with progressed:
                progressed.wait_for(lambda: all(len(s.token_ids) >= need or s.finish_reason for s in streams),
                                    timeout_s)
            action()
        for future in futures:
            future.result()
    channel.close()
    for stream in streams:
        stream.arrivals.pop()  # the end marker
        stream.finish_reason = max(stream.finish_reason, 0)
    return streams


def usable_verifiers(gateway) -> float:
    """The gateway's specdec_gateway_usable_verifiers gauge."""
    return scrape_metrics(gateway.metrics_port).get(("specdec_gateway_usable_verifiers", ()), float("nan"))


def wait_usable(gateway, n: int, timeout_s: float = 60.0) -> None:
    """Until the gateway counts n usable verifiers (it starts once one answers; the others join as they do)."""
    deadline = time.monotonic() + timeout_s
    while usable_verifiers(gateway) != n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the gateway did not count {n} usable verifiers within {timeout_s:.0f} s")
        time.sleep(0.1)


def resume_delays_ms(gateway_log: str) -> list[int]:
    """The gateway's per-request "first token N ms after the failure", in log order."""
    return [int(ms) for ms in RESUMED_LOG.findall(gateway_log)]


def resumes_counted(metrics: dict) -> float:
    return sum(value for (name, _), value in metrics.items() if name == "specdec_gateway_resumes_total")


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="target model directory (default: the tiny seeded pair, built here)")
    parser.add_argument("--verifiers", type=int, default=3)
    parser.add_argument("--streams", type=int, default=60)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--method", default="ngram", help="the draft's --method")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    from bench.core.machine import machine_info

    machine = machine_info(threads=1, omp_wait_policy="PASSIVE")  # each service's, as devkit.stack starts them
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        if args.model:
            target = draft = args.model
        else:
            from devkit.testing import build_tiny_pair

            target, draft = build_tiny_pair(root)
        texts = prompts(args.streams)
        with running_stack(target, draft, method=args.method, env=ENV, log_dir=root, verifiers=args.verifiers,
                           verifier_args=["--threads", "1", "--grace-s", "1"], timeout_s=300) as services:
            gateway = services["gateway"]
            wait_usable(gateway, args.verifiers)
            started = time.monotonic()
            reference = run_streams(gateway.address, texts, args.max_tokens)
            undisturbed_s = time.monotonic() - started
            victim = services[f"verifier{args.verifiers}" if args.verifiers > 1 else "verifier"]
            killed_at = []

            def kill() -> None:
                killed_at.append(time.monotonic())
                victim.kill()  # SIGKILL: no drain, its streams just end

            started = time.monotonic()
            disturbed = run_streams(gateway.address, texts, args.max_tokens,
                                    when_all_have=(max(1, args.max_tokens // 4), kill))
            disturbed_s = time.monotonic() - started
            time.sleep(0.5)  # the last log lines
            delays = resume_delays_ms(gateway.log())
            counted = resumes_counted(scrape_metrics(gateway.metrics_port))
        completed = [s for s in disturbed if not s.error and s.finish_reason]
        result = {
            "model": str(args.model or "tiny seeded pair (devkit.testing)"), "draft_method": args.method,
            "verifiers": args.verifiers, "streams": args.streams, "max_tokens": args.max_tokens,
            "killed": f"one verifier, SIGKILL, once every stream had {max(1, args.max_tokens // 4)} tokens",
            "streams_completed": len(completed),
            "streams_failed": [s.error for s in disturbed if s.error],
            "outputs_identical_to_undisturbed": sum(
                s.token_ids == r.token_ids and s.text == r.text and s.finish_reason == r.finish_reason
                for s, r in zip(disturbed, reference)),
            "tokens_undisturbed": sum(len(r.token_ids) for r in reference),
            "requests_resumed": counted,
            "resume_added_latency_ms": {"count": len(delays), "p50": percentile(delays, 0.5),
                                        "max": max(delays, default=None)},
            "client_longest_wait_ms": {
                run: {"p50": round(1000 * percentile(waits, 0.5)), "max": round(1000 * max(waits))}
                for run, waits in (("undisturbed", [s.longest_wait_s for s in reference]),
                                   ("disturbed", [s.longest_wait_s for s in disturbed]))},
            "wall_s": {"undisturbed": round(undisturbed_s, 2), "disturbed": round(disturbed_s, 2)},
        }
    result["machine"] = machine
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        pathlib.Path(args.out).write_text(text + "\n")
    ok = result["streams_completed"] == args.streams and result["outputs_identical_to_undisturbed"] == args.streams
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
