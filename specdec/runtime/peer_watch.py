"""Keep checking that each peer of a fleet is usable, and follow the addresses a DNS name stands for.

A peer (a verifier behind the gateway, a draft replica behind a verifier) is checked whenever its channel
reconnects, whenever its own grpc.health.v1 status changes (a Watch stream: a drain, SIGTERM, takes it out at
once), whenever a call to it failed as if it went away (`PeerWatch.suspect`), and every period_s. A check asks
grpc.health.v1 (a peer without it is judged on the rest alone), then what the subclass asks (`check_peer`:
its model or tokenizer). The verdict (`problem`: None while usable, else why not) and the peer's info are
reported through `on_change`, only when they changed.

`PoolWatch` runs one watch per peer of a pool, and with a DNS target (specdec.runtime.targets) adds and
retires peers as the name's addresses change. A pool is anything with `members` (address -> member), `add`
and `remove`; a member has `address`, `channel`, `problem`, `info`, `outstanding` (open calls: a retired
peer's channel closes once they end) and `suspect`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import typing

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specdec.runtime.targets import Targets, resolve

log = logging.getLogger(__name__)
CHECK_TIMEOUT_S = 5.0
HEALTH_RETRY_S = 1.0  # a broken health Watch stream is opened again after this long


class PeerWatch:
    """One peer's usability, kept current; `problem` is None while it is usable, else why not."""

    role = "peer"  # what the messages call it

    def __init__(self, channel: grpc.aio.Channel, address: str, period_s: float,
                 on_change: typing.Callable[[str | None, typing.Any], typing.Awaitable[None]]):
        self.channel = channel
        self.health = health_pb2_grpc.HealthStub(channel)
        self.address, self.period_s = address, period_s
        self.on_change = on_change
        self.problem: str | None = None
        self.info: typing.Any = None
        self.reported = False  # on_change has been called at least once
        self.wake = asyncio.Event()  # set: check now, not at the next period

    def not_answering(self, exc: grpc.aio.AioRpcError) -> str:
        return f"the {self.role} at {self.address} is not answering ({exc.code().name}: {exc.details()}); retry shortly"

    async def check_peer(self) -> tuple[str | None, typing.Any]:
        """(None, the peer's info) when it suits us; (why not, None) otherwise. Health has been checked."""
        return None, None

    async def check(self) -> tuple[str | None, typing.Any]:
        """(None, info) when the peer's health is SERVING (or it has no grpc.health.v1) and `check_peer` passes;
        (why not, None) otherwise."""
        try:
            health = await self.health.Check(health_pb2.HealthCheckRequest(), timeout=CHECK_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                return self.not_answering(exc), None
        else:
            if health.status != health_pb2.HealthCheckResponse.SERVING:
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(health.status)
                return (f"the {self.role} at {self.address} reports health {status} (draining or not ready); "
                        "retry shortly"), None
        return await self.check_peer()

    async def check_and_report(self) -> None:
        """Check, and tell the owner when the verdict or the peer's info changed (only then)."""
        problem, info = await self.check()
        if self.reported and (problem, info) == (self.problem, self.info):
            return
        if problem != self.problem:
            if problem:
                log.error("%s; it takes no requests until it is fixed", problem)
            elif self.problem:
                log.info("the %s at %s is usable again", self.role, self.address)
        self.problem, self.info, self.reported = problem, info, True
        await self.on_change(problem, info)

    async def suspect(self, reason: str) -> None:
        """A call to this peer failed as if it went away: it is unusable now and is checked again at once
        (the check brings it back if it answers)."""
        if self.problem is None:
            problem = f"the {self.role} at {self.address} dropped a request ({reason}); checking it"
            log.warning("%s", problem)
            self.problem, self.info, self.reported = problem, None, True
            await self.on_change(problem, None)
        self.wake.set()

    async def follow_health(self) -> None:
        """Wake the checks the moment the peer's health changes (a drain begins), not at the next period."""
        last = None
        while True:
            try:
                async for reply in self.health.Watch(health_pb2.HealthCheckRequest(), wait_for_ready=True):
                    if reply.status != last:
                        last = reply.status
                        self.wake.set()
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    return
                last = None
            await asyncio.sleep(HEALTH_RETRY_S)

    async def run(self) -> None:
        """Check at every connectivity change of the channel (a reconnect is one), every change of the peer's
        health, every suspicion, and every period_s."""
        follower = asyncio.create_task(self.follow_health())
        try:
            while True:
                self.wake.clear()
                await self.check_and_report()
                state = self.channel.get_state(try_to_connect=True)
                changed = asyncio.ensure_future(self.channel.wait_for_state_change(state))
                woken = asyncio.ensure_future(self.wake.wait())
                try:
                    await asyncio.wait({changed, woken}, timeout=self.period_s, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    changed.cancel()
                    woken.cancel()
        finally:
            follower.cancel()


class PoolWatch:
    """The peers of a pool, watched: one PeerWatch each (made by `watch_for`); with a DNS target, peers join and
    leave as the name's addresses change (looked up every period_s). `on_change` is awaited whenever a peer's
    verdict or info changes, or peers join or leave."""

    role = "peer"
    flag = "--peer"  # the flag that names the fleet, for the messages

    def __init__(self, pool, targets: Targets, period_s: float, on_change: typing.Callable[[], typing.Awaitable[None]]):
        self.pool, self.targets, self.period_s, self.on_change = pool, targets, period_s, on_change
        self.watches: dict[str, PeerWatch] = {}
        self.tasks: dict[str, asyncio.Task] = {}
        self.retired: list = []  # no longer in the DNS answer: closed once their last call ends

    def member_for(self, address: str):
        """A new member of the pool for `address`, with its own channel."""
        raise NotImplementedError

    def watch_for(self, member) -> PeerWatch:
        """The watch of a new member; it reports through `changed(member, problem, info)`."""
        raise NotImplementedError

    def _add(self, address: str) -> None:
        member = self.member_for(address)
        member.problem = "not checked yet"
        watch = self.watch_for(member)
        member.suspect = watch.suspect
        self.pool.add(member)
        self.watches[address] = watch

    async def changed(self, member, problem: str | None, info) -> None:
        member.problem, member.info = problem, info
        await self.on_change()

    async def refresh(self) -> list[str]:
        """Bring the pool in line with what the targets name now; returns the addresses added."""
        try:
            addresses = await resolve(self.targets, asyncio.get_running_loop())
        except (socket.gaierror, UnicodeError) as exc:
            log.warning("cannot resolve %s %s (%s); keeping the %d %ss known", self.flag, self.targets, exc,
                        len(self.pool.members), self.role)
            return []
        added = [a for a in addresses if a not in self.pool.members]
        for address in added:
            log.info("%s %s joins (%s %s)", self.role, address, self.flag, self.targets)
            self._add(address)
        gone = [a for a in self.pool.members if a not in addresses]
        for address in gone:
            log.info("%s %s leaves (no longer in %s %s); its open calls finish there", self.role, address,
                     self.flag, self.targets)
            self.watches.pop(address)
            task = self.tasks.pop(address, None)
            if task is not None:
                task.cancel()
            self.retired.append(self.pool.remove(address))
        if added or gone:
            await self.on_change()
        await self._close_idle_retired()
        return added

    async def _close_idle_retired(self) -> None:
        idle = [m for m in self.retired if m.outstanding == 0]
        self.retired = [m for m in self.retired if m.outstanding]
        for member in idle:
            await member.channel.close()

    async def check_all(self) -> None:
        """Check every peer once, together: the pool's first verdicts."""
        await asyncio.gather(*(watch.check_and_report() for watch in self.watches.values()))

    def _start_watches(self) -> None:
        for address, watch in self.watches.items():
            if address not in self.tasks:
                self.tasks[address] = asyncio.create_task(watch.run())

    async def run(self) -> None:
        """Watch every peer; with a DNS target, look the name up again every period_s."""
        try:
            while True:
                self._start_watches()
                await asyncio.sleep(self.period_s if self.targets.dns else 3600)
                if self.targets.dns:
                    await self.refresh()
        finally:
            for task in self.tasks.values():
                task.cancel()

    async def close(self) -> None:
        for member in [*self.pool.members.values(), *self.retired]:
            await member.channel.close()
