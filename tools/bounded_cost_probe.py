"""Bounded cost before work (issue 32, item 4): what a dense or many-valued input costs the gateway before it is refused.

    python -m tools.bounded_cost_probe --model .cache/models/smollm2-135m-instruct     # starts a stack
    python -m tools.bounded_cost_probe --gateway HOST:PORT --http-port PORT --gateway-pid PID

Cases, each refused as too long for the context:
  cjk_http       POST /v1/completions with about 2 MB of random CJK characters (UTF-8 in the JSON), under the
                 gateway's character bound: each character is several tokens, so the text is far past the context
  cjk_http_x3    the same, three at once
  cjk_grpc       Generate with a 720 KB prompt of random CJK characters
  chat_250k      POST /v1/chat/completions with 250,000 one-character messages (about 7.5 MB)
An `idle` case sends nothing: its health figures are the machine's noise floor. For each: the answer's status and time, the gateway's peak RSS growth (VmHWM after resetting it through
/proc/PID/clear_refs, and the maximum of RSS sampled every 10 ms), its RSS after, and the slowest answer of the
gateway's HTTP /health and gRPC health, each asked every 20 ms while the case runs. The bars: peak RSS up by
less than 100 MiB and an answer within 1 s for the CJK cases, health within 100 ms for the chat case.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import http.client
import json
import pathlib
import random
import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specdec.v1 import gateway_pb2
from tools.oversize_storm import status_kib

MiB = 1024 * 1024


def reset_peak(pid: int) -> None:
    """Reset the process's VmHWM to its current RSS (Linux: write 5 to clear_refs)."""
    pathlib.Path(f"/proc/{pid}/clear_refs").write_text("5")


def cjk(chars: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(chars))


class Watcher(threading.Thread):
    """RSS every 10 ms; HTTP and gRPC health every 20 ms, each on its own thread."""

    def __init__(self, pid: int, http_port: int, grpc_address: str):
        super().__init__(daemon=True)
        self.pid, self.http_port, self.grpc_address = pid, http_port, grpc_address
        self.rss_kib: list[int] = []
        self.http_ms: list[float] = []
        self.grpc_ms: list[float] = []
        self.stop_event = threading.Event()
        self.threads = [threading.Thread(target=self.http_health, daemon=True),
                        threading.Thread(target=self.grpc_health, daemon=True)]

    def run(self):
        for thread in self.threads:
            thread.start()
        while not self.stop_event.is_set():
            self.rss_kib.append(status_kib(self.pid, "VmRSS"))
            time.sleep(0.01)

    def http_health(self):
        connection = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=30)
        while not self.stop_event.is_set():
            started = time.perf_counter()
            connection.request("GET", "/health")
            connection.getresponse().read()
            self.http_ms.append((time.perf_counter() - started) * 1000)
            time.sleep(0.02)
        connection.close()

    def grpc_health(self):
        with grpc.insecure_channel(self.grpc_address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while not self.stop_event.is_set():
                started = time.perf_counter()
                stub.Check(health_pb2.HealthCheckRequest(), timeout=30)
                self.grpc_ms.append((time.perf_counter() - started) * 1000)
                time.sleep(0.02)

    def stop(self):
        self.stop_event.set()
        self.join()
        for thread in self.threads:
            thread.join()


def post(port: int, path: str, body: bytes) -> tuple[int, str, float]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    started = time.perf_counter()
    connection.request("POST", path, body, {"content-type": "application/json"})
    reply = connection.getresponse()
    text = reply.read().decode(errors="replace")
    elapsed = time.perf_counter() - started
    connection.close()
    return reply.status, text, elapsed


def generate(address: str, prompt: str) -> tuple[str, str, float]:
    with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 * MiB)]) as channel:
        call = channel.unary_unary("/specdec.v1.Gateway/Generate",
                                   request_serializer=gateway_pb2.GenerateRequest.SerializeToString,
                                   response_deserializer=gateway_pb2.GenerateResponse.FromString)
        started = time.perf_counter()
        try:
            call(gateway_pb2.GenerateRequest(prompt=prompt, max_tokens=4), timeout=120)
            code, details = "OK", ""
        except grpc.RpcError as exc:
            code, details = exc.code().name, exc.details() or ""
        return code, details, time.perf_counter() - started


def measure(name: str, pid: int, http_port: int, grpc_address: str, calls: list) -> dict:
    """Run the `calls` (each a no-argument function -> (status, text, seconds)) at once while watching."""
    time.sleep(1.0)  # let the previous case's memory settle
    before = status_kib(pid, "VmRSS")
    reset_peak(pid)
    watcher = Watcher(pid, http_port, grpc_address)
    watcher.start()
    time.sleep(0.3)
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        results = list(pool.map(lambda call: call(), calls))
    time.sleep(0.3)
    watcher.stop()
    hwm = status_kib(pid, "VmHWM")
    time.sleep(1.0)
    return {
        "case": name, "answers": [[status, round(seconds, 3), text[:160]] for status, text, seconds in results],
        "slowest_answer_s": round(max(r[2] for r in results), 3),
        "rss_mib": {"before": round(before / 1024, 1), "peak_vm_hwm": round(hwm / 1024, 1),
                    "peak_sampled": round(max(watcher.rss_kib) / 1024, 1),
                    "after": round(status_kib(pid, "VmRSS") / 1024, 1)},
        "peak_growth_mib": round((max(hwm, max(watcher.rss_kib)) - before) / 1024, 1),
        "http_health_max_ms": round(max(watcher.http_ms), 1), "http_health_checks": len(watcher.http_ms),
        "grpc_health_max_ms": round(max(watcher.grpc_ms), 1), "grpc_health_checks": len(watcher.grpc_ms),
    }


def probe(grpc_address: str, http_port: int, pid: int, only: list[str] | None = None) -> list[dict]:
    cjk_body = json.dumps({"prompt": cjk(655_000), "max_tokens": 4}, ensure_ascii=False).encode()
    grpc_prompt = cjk(240_000, seed=1)
    chat_body = json.dumps({"messages": [{"role": "user", "content": "a"}] * 250_000},
                           separators=(",", ":")).encode()
    print(f"bodies: cjk_http {len(cjk_body):,} bytes; cjk_grpc {len(grpc_prompt.encode()):,} bytes of prompt; "
          f"chat_250k {len(chat_body):,} bytes", flush=True)
    # warm up both doors (first-request imports and allocations are not the case's cost)
    post(http_port, "/v1/completions", json.dumps({"prompt": "Hello", "max_tokens": 2}).encode())
    generate(grpc_address, "Hello")
    completions = lambda: post(http_port, "/v1/completions", cjk_body)  # noqa: E731
    cases = [
        ("idle", [lambda: (0, "nothing sent: the noise floor of this machine", time.sleep(2) or 0.0)]),
        ("cjk_http", [completions]),
        ("cjk_http_x3", [completions] * 3),
        ("cjk_grpc", [lambda: generate(grpc_address, grpc_prompt)]),
        ("chat_250k", [lambda: post(http_port, "/v1/chat/completions", chat_body)]),
        ("chat_250k_again", [lambda: post(http_port, "/v1/chat/completions", chat_body)]),
    ]
    results = []
    for name, calls in cases:
        if only and name not in only:
            continue
        result = measure(name, pid, http_port, grpc_address, calls)
        print(json.dumps(result), flush=True)
        results.append(result)
    return results


def checks(results: list[dict]) -> dict[str, bool]:
    """The bars, over the cases that ran."""
    by_name = {result["case"]: result for result in results}
    cjk = [by_name[n] for n in ("cjk_http", "cjk_http_x3", "cjk_grpc") if n in by_name]
    chat = [by_name[n] for n in ("chat_250k", "chat_250k_again") if n in by_name]
    return {
        "cjk peak RSS growth < 100 MiB": all(r["peak_growth_mib"] < 100 for r in cjk),
        "cjk answered within 1 s": all(r["slowest_answer_s"] < 1 for r in cjk if r["case"] != "cjk_http_x3"),
        "chat_250k health within 100 ms": all(r["http_health_max_ms"] < 100 and r["grpc_health_max_ms"] < 100
                                              for r in chat),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="start a stack on this target model (n-gram draft, float32)")
    parser.add_argument("--gateway", help="HOST:PORT of a running gateway's gRPC port (with --http-port, --gateway-pid)")
    parser.add_argument("--http-port", type=int)
    parser.add_argument("--gateway-pid", type=int)
    parser.add_argument("--out", help="also write the results here as JSON")
    parser.add_argument("--cases", help="comma-separated case names to run (default: all)")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.model:
            from devkit.stack import running_stack

            services = stack.enter_context(running_stack(args.model, method="ngram",
                                                         verifier_args=["--dtype", "float32"]))
            gateway = services["gateway"]
            address, http_port, pid = gateway.address, gateway.http_port, gateway.process.pid
        elif args.gateway and args.http_port and args.gateway_pid:
            address, http_port, pid = args.gateway, args.http_port, args.gateway_pid
        else:
            parser.error("give --model, or --gateway, --http-port and --gateway-pid")
        results = probe(address, http_port, pid, args.cases.split(",") if args.cases else None)
    verdict = checks(results)
    print(json.dumps({"checks": verdict}, indent=1))
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps({"results": results, "checks": verdict}, indent=1) + "\n")
    return 0 if all(verdict.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
