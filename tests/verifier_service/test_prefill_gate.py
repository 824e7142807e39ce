"""verifier_service/prefill_gate.py: prompt tokens prefilling at once, first come first served, no deadlock."""

from __future__ import annotations

import asyncio

import pytest

from verifier_service.prefill_gate import PrefillGate


async def hold(gate: PrefillGate, tokens: int, log: list, name: str, release: asyncio.Event) -> None:
    async with gate.admitted(tokens):
        log.append(name)
        await release.wait()


def test_requests_past_the_budget_wait_in_arrival_order():
    async def scenario():
        gate, log = PrefillGate(100), []
        releases = {name: asyncio.Event() for name in "abcd"}
        sizes = {"a": 60, "b": 50, "c": 10, "d": 30}
        tasks = {n: asyncio.get_running_loop().create_task(hold(gate, sizes[n], log, n, releases[n])) for n in "abcd"}
        await asyncio.sleep(0)
        # b does not fit beside a; c would, but comes after b: it waits its turn
        assert log == ["a"] and gate.in_flight == 60 and gate.num_waiting == 3
        releases["a"].set()
        await asyncio.sleep(0.01)
        assert log == ["a", "b", "c", "d"] and gate.in_flight == 90
        for n in "bcd":
            releases[n].set()
        await asyncio.gather(*tasks.values())
        assert gate.in_flight == 0 and gate.num_waiting == 0

    asyncio.run(scenario())


def test_a_prompt_larger_than_the_budget_is_admitted_alone():
    async def scenario():
        gate, log = PrefillGate(100), []
        first, big = asyncio.Event(), asyncio.Event()
        small = asyncio.get_running_loop().create_task(hold(gate, 10, log, "small", first))
        huge = asyncio.get_running_loop().create_task(hold(gate, 500, log, "huge", big))
        await asyncio.sleep(0)
        assert log == ["small"]
        first.set()
        await asyncio.sleep(0.01)
        assert log == ["small", "huge"] and gate.in_flight == 500
        big.set()
        await asyncio.gather(small, huge)
        assert gate.in_flight == 0

    asyncio.run(scenario())


def test_a_cancelled_waiter_gives_up_its_place():
    async def scenario():
        gate, log = PrefillGate(100), []
        release = asyncio.Event()
        holder = asyncio.get_running_loop().create_task(hold(gate, 90, log, "holder", release))
        blocked = asyncio.get_running_loop().create_task(hold(gate, 80, log, "cancelled", release))
        behind = asyncio.get_running_loop().create_task(hold(gate, 10, log, "behind", release))
        await asyncio.sleep(0)
        blocked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await blocked
        await asyncio.sleep(0)
        assert log == ["holder", "behind"]  # no longer held back by the cancelled one
        release.set()
        await asyncio.gather(holder, behind)
        assert gate.in_flight == 0 and gate.num_waiting == 0

    asyncio.run(scenario())


def test_no_budget_admits_everything():
    async def scenario():
        gate = PrefillGate(0)
        async with gate.admitted(10_000), gate.admitted(10_000):
            assert gate.in_flight == 20_000

    asyncio.run(scenario())
