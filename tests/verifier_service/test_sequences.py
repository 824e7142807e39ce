"""verifier_service/sequences.py: admission caps and the reaper of idle calls."""

from __future__ import annotations

import asyncio

import pytest

from verifier_service.sequences import CapacityExceeded, SequenceRegistry


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
            live.write_started()
            try:
                await asyncio.sleep(60)  # a client that stopped reading: the write does not complete
            finally:
                registry.release(key)

        task = asyncio.get_running_loop().create_task(call())
        await asyncio.sleep(0.01)
        registry.live[next(iter(registry.live))].writing_since -= 1  # the write blocked for a second
        assert registry.reap() == 1
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.01)
        assert ended == ["status sent"] and not registry.live
        assert registry.reap() == 0
    asyncio.run(scenario())
