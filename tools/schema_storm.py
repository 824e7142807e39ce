"""The schema storm (issue 33): does a burst of large structured-outputs schemas cost the gateway's health anything?

    python -m tools.schema_storm --model .cache/models/smollm2-135m-instruct    # starts a stack (n-gram draft)
    python -m tools.schema_storm --gateway HOST:PORT --gateway-pid PID

Sends N (50) concurrent Generate calls, each with its own strict JSON Schema just under the constraint size limit
(an object of about 1,500 required string properties, so no two share a cache entry), from a separate process
at the lowest CPU priority (tools.oversize_storm.attacker), while another thread checks the gateway's health every
20 ms, at the same moment as a control's (tools.oversize_storm.Control: the gateway's figure is its time over the
control's), and reads its RSS every 10 ms. Before the storm it reads the gateway's CPU time over --idle-s seconds
of idling (what its verifier watch costs). The gateway forwards the schemas; the verifier compiles them, one at a
time on its compile thread, and refuses those past its queue as busy (RESOURCE_EXHAUSTED, retry later); calls
still waiting at --call-timeout-s end DEADLINE_EXCEEDED. Prints, and writes as JSON: the calls' status codes and
latencies, the health figures and the RSS. The bars: health within 100 ms over the control, peak RSS up by less
than 100 MB, no call answered INTERNAL or UNKNOWN.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import json
import os
import pathlib
import time

import grpc

from specdec.runtime.limits import MAX_CONSTRAINT_BYTES
from specdec.v1 import common_pb2, gateway_pb2
from tools.oversize_storm import (Control, Watcher, add_target_options, attacker, gateway_target, health_within,
                                  health_within_under_load, report, rss_mib)

GENERATE = "/specdec.v1.Gateway/Generate"


def large_schema(seed: int, target_bytes: int = MAX_CONSTRAINT_BYTES - 4096) -> str:
    """A strict schema of about target_bytes: required string properties named after the seed (distinct per seed)."""
    properties, size, i = {}, 80, 0
    while size < target_bytes:
        name = f"s{seed}_field_{i:05d}"
        properties[name] = {"type": "string"}
        size += 2 * len(name) + 28  # the property and its name in "required"
        i += 1
    return json.dumps({"type": "object", "properties": properties, "required": list(properties),
                       "additionalProperties": False})


def one_call(address: str, schema: str, timeout_s: float, metadata) -> tuple[str, float]:
    request = gateway_pb2.GenerateRequest(prompt="Fill in the record.", max_tokens=4,
                                          constraint=common_pb2.Constraint(json_schema=schema, strict=True))
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(GENERATE, request_serializer=gateway_pb2.GenerateRequest.SerializeToString,
                                   response_deserializer=gateway_pb2.GenerateResponse.FromString)
        started = time.perf_counter()
        try:
            call(request, timeout=timeout_s, metadata=metadata)
            code = "OK"
        except grpc.RpcError as exc:
            code = exc.code().name
        return code, time.perf_counter() - started


def burst(address: str, schemas: list[str], timeout_s: float, metadata=()) -> list[tuple[str, float]]:
    """All the calls at once (run in the attacker's process)."""
    with concurrent.futures.ThreadPoolExecutor(len(schemas)) as pool:
        return list(pool.map(lambda schema: one_call(address, schema, timeout_s, metadata), schemas))


def cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time (/proc/PID/stat)."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def storm(address: str, pid: int, schemas: int = 50, call_timeout_s: float = 30.0, idle_s: float = 10.0,
          metadata=()) -> dict:
    texts = [large_schema(seed) for seed in range(schemas)]
    cpu_before = cpu_seconds(pid)
    time.sleep(idle_s)
    idle_cpu = (cpu_seconds(pid) - cpu_before) / idle_s
    senders = attacker()
    senders.submit(large_schema, 0, 100).result()  # started and imported before anything is timed
    control = Control()
    time.sleep(0.5)
    before = rss_mib(pid)
    watcher = Watcher(address, pid, metadata, control.address)
    watcher.start()
    try:
        started = time.perf_counter()
        results = senders.submit(burst, address, texts, call_timeout_s, metadata).result()
        seconds = time.perf_counter() - started
        time.sleep(0.5)
    finally:
        watcher.stop()
        control.close()
        senders.shutdown()
    codes = collections.Counter(code for code, _ in results)
    return {
        "schemas": schemas, "schema_bytes": [min(map(len, texts)), max(map(len, texts))],
        "constraint_limit_bytes": MAX_CONSTRAINT_BYTES, "storm_s": round(seconds, 2), "codes": dict(codes),
        "latency_s_by_code": {code: [round(min(s for c, s in results if c == code), 3),
                                     round(max(s for c, s in results if c == code), 3)] for code in codes},
        "gateway_idle_cpu_percent": round(100 * idle_cpu, 2), **watcher.health_figures(),
        "rss_mib": {"before": round(before, 1), "sampled_peak": round(max(watcher.rss), 1),
                    "after": round(rss_mib(pid), 1)},
    }


def passed(result: dict, shared_cores: bool = False) -> dict[str, bool]:
    """The storm's bars; shared_cores: health held to health_within_under_load rather than every check."""
    health = health_within_under_load if shared_cores else health_within
    return {
        "health within 100 ms": health(result, 100.0),
        "peak RSS up < 100 MB": result["rss_mib"]["sampled_peak"] - result["rss_mib"]["before"] < 100,
        "no INTERNAL or UNKNOWN": not {"INTERNAL", "UNKNOWN"} & set(result["codes"]),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_target_options(parser)
    parser.add_argument("--schemas", type=int, default=50)
    parser.add_argument("--call-timeout-s", type=float, default=30.0)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--out", default="bench/results/grammar/schema_storm.json")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        result = storm(*gateway_target(parser, args, stack), args.schemas, args.call_timeout_s, args.idle_s)
    return report(result, passed(result), args.out)


if __name__ == "__main__":
    raise SystemExit(main())
