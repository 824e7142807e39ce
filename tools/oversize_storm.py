"""The oversized-input storm (issue 13, item 1): does a flood of prompts that cannot fit cost the gateway anything?

    python -m tools.oversize_storm --model .cache/models/smollm2-135m-instruct     # starts a stack
    python -m tools.oversize_storm --gateway HOST:PORT --gateway-pid PID          # one already running

Sends N concurrent Generate calls with a 4 MB text prompt ("😀" x 1,000,000), then N with 15 M prompt
token ids (each id 1: one byte on the wire, so the message is 15 MB, under gRPC's 16 MiB cap), while
another thread checks the gateway's health every 20 ms and reads its RSS (/proc/PID/status) every 10 ms.
Prints, and writes as JSON: each call's status code and latency, the slowest health answer, and the
gateway's RSS before, at its peak (VmHWM and the sampled maximum) and after. The bars it is held to:
every call refused for its size within 1 s, health within 100 ms throughout, peak RSS up by less than 100 MB.

"Health within 100 ms" is counted over the machine's own floor, the same way: each health check goes at the
same moment to the gateway and to a control, a bare grpc.health.v1 server in a process of its own (`Control`),
and the gateway's figure for that check is its answer's time less the control's. A stall of the whole machine
or of the checking process (a loaded 2-core box: the other test worker's stacks) delays both answers alike and
is not the gateway's; a stall of the gateway delays only its own. The raw times are reported too (median, 99th
percentile, max), and so is the control's.

"Within 1 s" is counted over the transport's own floor: right after each wave the same calls go to a bare
gRPC server in this process (no handler runs; the same 4 MiB receive cap), and the time that server takes
to refuse the same bytes is subtracted. On 2 cores, 8 concurrent 15 MB sends take 0.25-0.9 s to be refused
by a server that does nothing at all (measured), which is the client's send and gRPC reading the frames,
not the gateway.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import pathlib
import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specdec.v1 import gateway_pb2

GENERATE = "/specdec.v1.Gateway/Generate"
MiB = 1024 * 1024


def status_kib(pid: int, field: str = "VmRSS") -> int:
    """A /proc/PID/status memory field (VmRSS, VmHWM, ...) in KiB."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} for pid {pid}")


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    return status_kib(pid, field) / 1024


def payloads(prompt_chars: int, ids: int) -> dict[str, bytes]:
    text = gateway_pb2.GenerateRequest(prompt="😀" * prompt_chars, max_tokens=4).SerializeToString()
    request = gateway_pb2.GenerateRequest(max_tokens=4)
    request.prompt_token_ids.ids.extend([1] * ids)
    return {"text": text, "ids": request.SerializeToString()}


def _serve_control(ports, stop) -> None:
    """A bare grpc.health.v1 server answering SERVING, until `stop` is set (run in its own process)."""
    from concurrent import futures

    from grpc_health.v1 import health

    server = grpc.server(futures.ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    ports.put(server.add_insecure_port("127.0.0.1:0"))
    server.start()
    stop.wait()
    server.stop(None)


class Control:
    """The control for health checks: a bare health server in a process of its own, at the default priority."""

    def __init__(self):
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        ports, self.stop_event = context.Queue(), context.Event()
        self.process = context.Process(target=_serve_control, args=(ports, self.stop_event), daemon=True)
        self.process.start()
        self.address = f"127.0.0.1:{ports.get(timeout=60)}"

    def close(self):
        self.stop_event.set()
        self.process.join(10)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Watcher(threading.Thread):
    """Health latency every 20 ms (the gateway's, and at the same moment a control's when given) and RSS every
    10 ms, until stopped."""

    def __init__(self, address: str, pid: int, metadata=(), control: str | None = None):
        super().__init__(daemon=True)
        self.channel = grpc.insecure_channel(address)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.control_channel = grpc.insecure_channel(control) if control else None
        self.control = health_pb2_grpc.HealthStub(self.control_channel) if control else None
        self.pid, self.metadata = pid, metadata
        self.health_ms: list[float] = []
        self.control_ms: list[float] = []  # the control's answer to the same check (when there is a control)
        self.health_failures = 0
        self.rss: list[float] = []
        self.stop_event = threading.Event()
        self.pause = threading.Event()  # set while the bare server's floor is measured: not the gateway's time

    def run(self):
        next_health = 0.0
        while not self.stop_event.is_set():
            if self.pause.is_set():
                time.sleep(0.01)
                continue
            self.rss.append(rss_mib(self.pid))
            now = time.perf_counter()
            if now >= next_health:
                self.check()
                next_health = now + 0.02
            time.sleep(0.01)

    def check(self) -> None:
        """One health check of the gateway, and of the control at the same moment."""
        done: dict[str, float] = {}
        started = time.perf_counter()
        calls = {"gateway": self.health.Check.future(health_pb2.HealthCheckRequest(), timeout=5)}
        if self.control is not None:
            calls["control"] = self.control.Check.future(health_pb2.HealthCheckRequest(), timeout=5)
        for name, call in calls.items():
            call.add_done_callback(lambda _call, name=name: done.setdefault(name, time.perf_counter()))
        for name, call in calls.items():
            try:
                call.result()
            except grpc.RpcError:
                self.health_failures += 1
        finished = time.perf_counter()
        self.health_ms.append((done.get("gateway", finished) - started) * 1000)
        if self.control is not None:
            self.control_ms.append((done.get("control", finished) - started) * 1000)

    def health_figures(self) -> dict:
        """The raw answers' median, 99th percentile and max; with a control, the control's max and the largest
        excess of the gateway's time over the control's in one check (the gateway's own delay)."""
        figures = {"health_max_ms": round(max(self.health_ms), 1),
                   "health_p50_ms": round(percentile(self.health_ms, 0.5), 1),
                   "health_p99_ms": round(percentile(self.health_ms, 0.99), 1),
                   "health_checks": len(self.health_ms), "health_failures": self.health_failures}
        if self.control_ms:
            excess = [g - c for g, c in zip(self.health_ms, self.control_ms)]
            figures.update({"control_max_ms": round(max(self.control_ms), 1),
                            "health_over_control_max_ms": round(max(excess), 1),
                            "health_over_control_p99_ms": round(percentile(excess, 0.99), 1)})
        return figures

    def stop(self):
        self.stop_event.set()
        self.join()
        self.channel.close()
        if self.control_channel is not None:
            self.control_channel.close()


def one_call(address: str, payload: bytes, metadata) -> tuple[str, float, str]:
    with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 * MiB)]) as channel:
        call = channel.unary_stream(GENERATE, request_serializer=None, response_deserializer=None)
        started = time.perf_counter()
        try:
            list(call(payload, timeout=60, metadata=metadata))
            code, details = "OK", ""
        except grpc.RpcError as exc:
            code, details = exc.code().name, exc.details() or ""
        return code, time.perf_counter() - started, details


class BareServer:
    """A gRPC server with the gateway's receive cap and no work: what refusing the bytes costs by itself."""

    def __init__(self):
        from concurrent import futures

        self.server = grpc.server(futures.ThreadPoolExecutor(4),
                                  options=[("grpc.max_receive_message_length", 4 * MiB)])
        handler = grpc.unary_stream_rpc_method_handler(lambda request, context: iter(()))
        self.server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler("specdec.v1.Gateway", {"Generate": handler})])
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def close(self):
        self.server.stop(None)


_PAYLOADS: dict[tuple[int, int], dict[str, bytes]] = {}


def wave(address: str, name: str, sizes: tuple[int, int], concurrency: int, metadata=()) -> tuple[int, list]:
    """`concurrency` concurrent calls with payload `name`; (message bytes, [(code, seconds, details)])."""
    if sizes not in _PAYLOADS:
        _PAYLOADS[sizes] = payloads(*sizes)
    payload = _PAYLOADS[sizes][name]
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        return len(payload), list(pool.map(lambda _: one_call(address, payload, metadata), range(concurrency)))


def attacker() -> concurrent.futures.ProcessPoolExecutor:
    """The senders run in their own process at the lowest CPU priority: on a 2-core box they would otherwise
    take the cores from the gateway they are measuring, and health latency would time the attacker's own
    sending. In production the attacker is not on the gateway's cores."""
    import multiprocessing
    import os

    return concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                                  initializer=os.nice, initargs=(19,))


def storm(address: str, pid: int, concurrency: int = 8, prompt_chars: int = 1_000_000, ids: int = 15_000_000,
          metadata=()) -> dict:
    """Run both waves against the gateway at `address` (process `pid`); what was measured."""
    sizes = (prompt_chars, ids)
    senders = attacker()
    senders.submit(payloads, 1, 1).result()  # started and imported before anything is timed
    time.sleep(0.5)
    before = rss_mib(pid)
    control = Control()
    watcher = Watcher(address, pid, metadata, control.address)
    watcher.start()
    waves = {}
    bare = BareServer()
    try:
        for name in ("text", "ids"):
            size, results = senders.submit(wave, address, name, sizes, concurrency, metadata).result()
            watcher.pause.set()
            _, floor = senders.submit(wave, bare.address, name, sizes, concurrency).result()
            watcher.pause.clear()
            waves[name] = {"message_bytes": size, "codes": sorted({r[0] for r in results}),
                           "max_latency_s": round(max(r[1] for r in results), 3),
                           "bare_grpc_max_latency_s": round(max(r[1] for r in floor), 3),
                           "details": results[0][2][:300]}
        time.sleep(0.5)
    finally:
        watcher.stop()
        control.close()
        bare.close()
        senders.shutdown()
    return {
        "concurrency": concurrency, "waves": waves, **watcher.health_figures(),
        "rss_mib": {"before": round(before, 1), "sampled_peak": round(max(watcher.rss), 1),
                    "after": round(rss_mib(pid), 1), "vm_hwm": round(rss_mib(pid, "VmHWM"), 1)},
    }


def health_within(result: dict, bound_ms: float) -> bool:
    """Every health check answered, each within bound_ms over the control's answer to the same check (the raw time
    where no control was measured)."""
    slowest = result.get("health_over_control_max_ms", result["health_max_ms"])
    return slowest < bound_ms and not result["health_failures"]


def health_within_under_load(result: dict, bound_ms: float, stall_ms: float = 1000.0) -> bool:
    """As health_within for 99% of the checks, and every check within stall_ms (a health probe's usual timeout):
    the bar for a storm measured while other work shares the cores (a test suite's other worker), where one check
    in a few hundred can wait for a core whichever process it is sent to."""
    excess = result.get("health_over_control_p99_ms", result["health_p99_ms"])
    slowest = result.get("health_over_control_max_ms", result["health_max_ms"])
    return excess < bound_ms and slowest < stall_ms and not result["health_failures"]


def passed(result: dict, shared_cores: bool = False) -> dict[str, bool]:
    """The storm's bars; shared_cores: health held to health_within_under_load rather than every check."""
    health = health_within_under_load if shared_cores else health_within
    return {
        # refused for its size: INVALID_ARGUMENT when read, RESOURCE_EXHAUSTED when gRPC refuses it unbuffered
        "all refused for size": all(w["codes"] in (["INVALID_ARGUMENT"], ["RESOURCE_EXHAUSTED"])
                                    for w in result["waves"].values()),
        "each within 1 s": all(w["max_latency_s"] - w.get("bare_grpc_max_latency_s", 0.0) < 1.0
                               for w in result["waves"].values()),
        "health within 100 ms": health(result, 100.0),
        "peak RSS up < 100 MB": result["rss_mib"]["sampled_peak"] - result["rss_mib"]["before"] < 100,
    }


def add_target_options(parser: argparse.ArgumentParser) -> None:
    """The gateway a storm goes to: a stack started on --model, or one running (--gateway, --gateway-pid)."""
    parser.add_argument("--model", help="start a stack on this target model (n-gram draft)")
    parser.add_argument("--gateway", help="HOST:PORT of a running gateway (with --gateway-pid)")
    parser.add_argument("--gateway-pid", type=int)


def gateway_target(parser, args, stack: contextlib.ExitStack) -> tuple[str, int]:
    """(address, pid) of the gateway that add_target_options named; a started stack lives as long as `stack`."""
    if args.model:
        from devkit.stack import running_stack

        services = stack.enter_context(running_stack(args.model, method="ngram", verifier_args=["--dtype", "float32"],
                                                     timeout_s=600))
        return services["gateway"].address, services["gateway"].process.pid
    if args.gateway and args.gateway_pid:
        return args.gateway, args.gateway_pid
    parser.error("give --model, or --gateway and --gateway-pid")


def report(result: dict, checks: dict[str, bool], out: str) -> int:
    """Print and write the result with its checks and the machine; exit status 0 when every check passed."""
    from bench.core.machine import machine_info

    result["checks"] = checks
    result["machine"] = machine_info(0, "PASSIVE")
    print(json.dumps(result, indent=1))
    pathlib.Path(out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(out).write_text(json.dumps(result, indent=1) + "\n")
    return 0 if all(checks.values()) else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_target_options(parser)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--out", default="bench/results/oversize_storm.json")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        result = storm(*gateway_target(parser, args, stack), args.concurrency)
    return report(result, passed(result), args.out)


if __name__ == "__main__":
    raise SystemExit(main())
