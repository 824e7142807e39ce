"""Cancellation and memory: clients that cancel or run out of deadline mid-stream leave nothing behind.

Each service exposes specdec_live_sequences (the gateway counts requests in flight,
the verifier and the draft count sequences holding state). After a few hundred
cancelled requests every gauge is back to 0 and each process's RSS is back within
a small margin of where it was after warm-up.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import grpc
import pytest

from specdec.v1 import gateway_pb2, gateway_pb2_grpc
from tests.reliability.support import API_KEY, LONG_PROMPT, gauge, rss_mib, wait_for

pytestmark = pytest.mark.slow

NUM_CANCELLED = int(os.environ.get("SPECDEC_RELIABILITY_CANCELLED", "240"))
CONCURRENCY = 16
RSS_MARGIN_MIB = 24.0
METADATA = (("authorization", f"Bearer {API_KEY}"),)


async def cancel_many(address: str, count: int, concurrency: int) -> dict:
    """Half cancel after the first message, a quarter after a few, a quarter hit a deadline mid-stream."""
    outcomes = {"cancelled": 0, "deadline": 0, "finished": 0, "other": []}
    request = gateway_pb2.GenerateRequest(prompt=LONG_PROMPT, max_tokens=300)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        gate = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with gate:
                deadline = 0.15 if i % 4 == 3 else 60
                call = stub.GenerateStream(request, timeout=deadline, metadata=METADATA)
                try:
                    read = 0
                    async for _ in call:
                        read += 1
                        if i % 4 != 3 and read >= (1 if i % 2 == 0 else 3):
                            call.cancel()
                            break
                    else:
                        outcomes["finished"] += 1
                        return
                    outcomes["cancelled"] += 1
                except grpc.aio.AioRpcError as exc:
                    if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                        outcomes["deadline"] += 1
                    elif exc.code() == grpc.StatusCode.CANCELLED:
                        outcomes["cancelled"] += 1
                    else:
                        outcomes["other"].append(f"{exc.code().name}: {exc.details()}")

        await asyncio.gather(*(one(i) for i in range(count)))
    return outcomes


def live(stack) -> dict:
    return {name: gauge(service) for name, service in stack.services.items()}


def rss(stack) -> dict:
    return {name: round(rss_mib(service.process.pid), 1) for name, service in stack.services.items()}


def all_idle(stack) -> bool:
    return all(value == 0 for value in live(stack).values())


def test_cancelled_and_expired_requests_free_every_sequence_and_memory(main_stack, tmp_path):
    address = main_stack.gateway.address
    # warm up: allocator pools, caches and lazily built state reach their steady size
    warm = asyncio.run(cancel_many(address, 48, CONCURRENCY))
    assert not warm["other"], warm
    assert wait_for(lambda: all_idle(main_stack), 30), live(main_stack)
    before = rss(main_stack)

    started = time.perf_counter()
    outcomes = asyncio.run(cancel_many(address, NUM_CANCELLED, CONCURRENCY))
    elapsed = time.perf_counter() - started
    assert not outcomes["other"], outcomes["other"][:5]
    assert outcomes["cancelled"] + outcomes["deadline"] + outcomes["finished"] == NUM_CANCELLED
    assert outcomes["cancelled"] >= NUM_CANCELLED // 2

    assert wait_for(lambda: all_idle(main_stack), 30), f"live sequences left behind: {live(main_stack)}"
    after = rss(main_stack)
    report = {"requests": NUM_CANCELLED, "concurrency": CONCURRENCY, "outcomes": {k: v for k, v in outcomes.items()
                                                                                 if k != "other"},
              "seconds": round(elapsed, 1), "rss_mib_before": before, "rss_mib_after": after}
    (tmp_path / "cancellation.json").write_text(json.dumps(report, indent=1))
    print("cancellation:", json.dumps(report))
    for name in before:
        assert after[name] - before[name] <= RSS_MARGIN_MIB, f"{name} grew: {before[name]} -> {after[name]} MiB"

    # and the stack still serves
    stub = gateway_pb2_grpc.GatewayStub(grpc.insecure_channel(address))
    response = stub.Generate(gateway_pb2.GenerateRequest(prompt="ok", max_tokens=4), timeout=60, metadata=METADATA)
    assert response.usage.completion_tokens == len(response.token_ids) >= 1
