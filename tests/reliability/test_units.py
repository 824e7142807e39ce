"""Fast, in-process checks of the reliability mechanisms: back-off, the reaper, auth parsing, loadtest maths."""

from __future__ import annotations

import asyncio
import importlib.util
import pathlib

import grpc
import pytest

from gateway.auth import parse_keys, presented_key
from specdec import config as specdec_config
from specdec.v1 import common_pb2
from verifier_service.draft_client import Backoff, DraftLink
from verifier_service.sequences import CapacityExceeded, SequenceRegistry

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_backoff_doubles_to_a_ceiling_and_resets():
    backoff = Backoff(initial_s=0.25, maximum_s=1.0)
    assert backoff.ready()
    delays = []
    for _ in range(5):
        backoff.failed()
        delays.append(backoff.delay_s)
    assert delays == [0.25, 0.5, 1.0, 1.0, 1.0]
    assert not backoff.ready()
    backoff.succeeded()
    assert backoff.ready() and backoff.delay_s == 0


def test_caps_refuse_before_memory_runs_out():
    async def scenario():
        registry = SequenceRegistry(max_sequences=2, max_cache_tokens=100, ttl_s=0)
        key, _ = registry.admit("a", 60)
        with pytest.raises(CapacityExceeded, match="--max-cache-tokens"):
            registry.admit("b", 41)
        registry.admit("c", 40)
        with pytest.raises(CapacityExceeded, match="--max-sequences"):
            registry.admit("d", 1)
        registry.release(key)
        registry.release(key)  # twice is harmless
        registry.admit("e", 1)
        assert registry.reserved_tokens == 41
    asyncio.run(scenario())


def test_reaper_cancels_idle_calls_and_ends_them_with_a_status():
    async def scenario():
        registry = SequenceRegistry(max_sequences=4, max_cache_tokens=1000, ttl_s=0.05)
        ended = []

        async def call():
            key, live = registry.admit("idle", 10)

            async def on_reap():
                ended.append("status sent")
            live.on_reap = on_reap
            try:
                await asyncio.sleep(60)  # a client that stopped reading
            finally:
                registry.release(key)

        task = asyncio.get_running_loop().create_task(call())
        await asyncio.sleep(0.01)
        registry.live[next(iter(registry.live))].last_active -= 1  # idle for a second
        assert registry.reap() == 1
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.01)
        assert ended == ["status sent"] and not registry.live
        assert registry.reap() == 0
    asyncio.run(scenario())


class FakeError(grpc.aio.AioRpcError):
    def __init__(self, code):
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=code.name)


def test_a_request_the_draft_refuses_does_not_back_off_everyone():
    async def scenario():
        link = DraftLink("127.0.0.1:1", specdec_config.ServerConfig(), common_pb2.ModelInfo(vocab_size=10), 0.1)
        link.checked = True
        link.failed(FakeError(grpc.StatusCode.INVALID_ARGUMENT))
        assert link.available() and link.checked
        link.failed(FakeError(grpc.StatusCode.UNAVAILABLE))
        assert not link.available()
        assert not link.checked, "after a failure, whatever answers next gets its tokenizer checked again"
        link.backoff.succeeded()
        link.failed(TimeoutError())
        assert not link.available()
        await link.close()
    asyncio.run(scenario())


def test_api_key_parsing():
    assert parse_keys(" a, ,b ,") == ["a", "b"]
    assert presented_key([("authorization", "Bearer  k1 ")]) == "k1"
    assert presented_key([("authorization", "bearer k2")]) == "k2"
    assert presented_key([("x-api-key", "k3")]) == "k3"
    assert presented_key([("authorization", "Basic k4")]) == ""
    assert presented_key(None) == ""


def test_loadtest_percentiles():
    spec = importlib.util.spec_from_file_location("loadtest", REPO_ROOT / "tools" / "loadtest.py")
    loadtest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loadtest)
    values = [float(v) for v in range(1, 101)]
    assert loadtest.percentile(values, 50) == 50
    assert loadtest.percentile(values, 99) == 99
    assert loadtest.percentile(values, 100) == 100
    assert loadtest.percentile([], 50) is None
    assert loadtest.percentile([3.0], 99) == 3.0
