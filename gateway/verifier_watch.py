"""Keep checking that the verifier is usable: answering, with the gateway's tokenizer, and the same model.

At start-up the gateway refuses a verifier with another tokenizer (`check_peers`), and pins the model the
verifier serves (its ModelInfo.model_fingerprint). A verifier can be replaced while the gateway runs (a
rollout, a wrong image), so the watch asks GetModelInfo again whenever the channel reconnects, and every
--peer-check-s. A verifier with another tokenizer, or another model under the same tokenizer (its output
would be served under the pinned model's name), is unusable until the pinned model is back or the gateway
restarts. While the verifier is unusable:
- the gateway's health is NOT_SERVING, so probes and balancers take it out. The watch's verdict is the
  gateway's one health truth: gRPC health and HTTP /health both report it, and nothing else;
- requests are refused with UNAVAILABLE and the reason, before they are tokenized.

The watch is for health and clear errors. Correctness does not wait for it: every Decode carries the
gateway's tokenizer fingerprint, which the verifier checks (FAILED_PRECONDITION on a mismatch).

With several verifiers (gateway.verifier_pool), each has its own watch, and one that is unusable only leaves
the pool: `PoolWatch` runs the watches, follows a DNS name's addresses, and the gateway is NOT_SERVING only
while no verifier is usable. A verifier is also unusable while its own grpc.health.v1 says NOT_SERVING (it is
draining: SIGTERM); the watch follows its health with a Watch stream, so a drain takes it out of the pool at
once, and a request that lost its verifier takes it out too (`VerifierWatch.suspect`) until a check passes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import typing

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.verifier_pool import Verifier, VerifierPool, VerifierTargets, resolve
from specdec.modeling import models
from specdec.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc

log = logging.getLogger(__name__)
CHECK_TIMEOUT_S = 5.0
HEALTH_RETRY_S = 1.0  # a broken health Watch stream is opened again after this long
GATEWAY_ADVICE = "The gateway tokenizes for the verifier: run both with the same model (--model)."


class VerifierWatch:
    """The verifier's usability, kept current; `problem` is None while it is usable, else why not."""

    def __init__(self, channel: grpc.aio.Channel, address: str, tokenizer: common_pb2.ModelInfo, period_s: float,
                 on_change: typing.Callable[[str | None, common_pb2.ModelInfo | None], typing.Awaitable[None]],
                 model: common_pb2.ModelInfo | None = None):
        """tokenizer: the gateway's own; model: the verifier's ModelInfo at start-up (its model is pinned)."""
        self.channel = channel
        self.stub = verifier_pb2_grpc.VerifierServiceStub(channel)
        self.health = health_pb2_grpc.HealthStub(channel)
        self.address, self.tokenizer, self.period_s = address, tokenizer, period_s
        self.model = model or common_pb2.ModelInfo()
        self.on_change = on_change
        self.problem: str | None = None
        self.info: common_pb2.ModelInfo | None = None
        self.reported = False  # on_change has been called at least once
        self.wake = asyncio.Event()  # set: check now, not at the next period

    async def check(self) -> tuple[str | None, common_pb2.ModelInfo | None]:
        """(None, the verifier's ModelInfo) when it answers with our tokenizer and model and its health is SERVING;
        (why not, None) otherwise. A verifier without grpc.health.v1 is judged on GetModelInfo alone."""
        try:
            health = await self.health.Check(health_pb2.HealthCheckRequest(), timeout=CHECK_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                return (f"the verifier at {self.address} is not answering ({exc.code().name}: {exc.details()}); "
                        "retry shortly"), None
        else:
            if health.status != health_pb2.HealthCheckResponse.SERVING:
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(health.status)
                return (f"the verifier at {self.address} reports health {status} (draining or not ready); "
                        "retry shortly"), None
        try:
            reply = await self.stub.GetModelInfo(verifier_pb2.GetModelInfoRequest(), timeout=CHECK_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            return (f"the verifier at {self.address} is not answering ({exc.code().name}: {exc.details()}); "
                    "retry shortly"), None
        problem = models.tokenizer_mismatch(reply.info, self.tokenizer, role="the gateway's --model",
                                            target_role="the verifier", advice=GATEWAY_ADVICE)
        if problem:
            return f"the verifier at {self.address} was replaced by an incompatible one: {problem}", None
        problem = models.model_mismatch(self.model, reply.info)
        if problem:
            return (f"the verifier at {self.address} was replaced by another model: {problem}. Put the model back, "
                    "or restart the gateway to serve the new one"), None
        return None, reply.info

    async def check_and_report(self) -> None:
        """Check, and tell the gateway when the verdict or the verifier's model info changed (only then)."""
        problem, info = await self.check()
        if self.reported and (problem, info) == (self.problem, self.info):
            return
        if problem != self.problem:
            if problem:
                log.error("%s; it takes no requests until it is fixed", problem)
            elif self.problem:
                log.info("the verifier at %s is usable again", self.address)
        self.problem, self.info, self.reported = problem, info, True
        await self.on_change(problem, info)

    async def suspect(self, reason: str) -> None:
        """A call to this verifier failed as if it went away: it leaves the pool now and is checked again at once
        (the check brings it back if it answers)."""
        if self.problem is None:
            problem = f"the verifier at {self.address} dropped a request ({reason}); checking it"
            log.warning("%s", problem)
            self.problem, self.info, self.reported = problem, None, True
            await self.on_change(problem, None)
        self.wake.set()

    async def follow_health(self) -> None:
        """Wake the checks the moment the verifier's health changes (a drain begins), not at the next period."""
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
        """Check at every connectivity change of the channel (a reconnect is one), every change of the verifier's
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
    """The verifiers of a pool, watched: one VerifierWatch each; with a DNS target, verifiers join and leave as
    the name's addresses change (looked up every period_s). `on_change` is awaited whenever a verifier's
    verdict or model info changes; the pool's verdict is then `pool.problem()`."""

    def __init__(self, pool: VerifierPool, targets: VerifierTargets,
                 open_channel: typing.Callable[[str], grpc.aio.Channel], tokenizer: common_pb2.ModelInfo,
                 period_s: float, on_change: typing.Callable[[], typing.Awaitable[None]]):
        self.pool, self.targets, self.open_channel = pool, targets, open_channel
        self.tokenizer, self.period_s, self.on_change = tokenizer, period_s, on_change
        self.model = common_pb2.ModelInfo()  # pinned by `pin`, from the first verifier that answered
        self.watches: dict[str, VerifierWatch] = {}
        self.tasks: dict[str, asyncio.Task] = {}
        self.retired: list[Verifier] = []  # no longer in the DNS answer: closed once their last call ends

    def pin(self, model: common_pb2.ModelInfo) -> None:
        """The model the gateway serves: every verifier must serve it (the same model fingerprint)."""
        self.model = model
        for watch in self.watches.values():
            watch.model = model

    def _add(self, address: str) -> None:
        verifier = Verifier(address, self.open_channel(address))
        verifier.problem = "not checked yet"
        watch = VerifierWatch(verifier.channel, address, self.tokenizer, self.period_s,
                              functools.partial(self._changed, verifier), model=self.model)
        verifier.suspect = watch.suspect
        self.pool.add(verifier)
        self.watches[address] = watch

    async def _changed(self, verifier: Verifier, problem: str | None, info: common_pb2.ModelInfo | None) -> None:
        verifier.problem, verifier.info = problem, info
        await self.on_change()

    async def refresh(self) -> list[str]:
        """Bring the pool in line with what the targets name now; returns the addresses added."""
        try:
            addresses = await resolve(self.targets, asyncio.get_running_loop())
        except (socket.gaierror, UnicodeError) as exc:
            log.warning("cannot resolve --verifier %s (%s); keeping the %d verifiers known", self.targets, exc,
                        len(self.pool.members))
            return []
        added = [a for a in addresses if a not in self.pool.members]
        for address in added:
            log.info("verifier %s joins (--verifier %s)", address, self.targets)
            self._add(address)
        gone = [a for a in self.pool.members if a not in addresses]
        for address in gone:
            log.info("verifier %s leaves (no longer in --verifier %s); its open requests finish there",
                     address, self.targets)
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
        idle = [v for v in self.retired if v.outstanding == 0]
        self.retired = [v for v in self.retired if v.outstanding]
        for verifier in idle:
            await verifier.channel.close()

    async def check_all(self) -> None:
        """Check every verifier once, together: the pool's first verdicts, before the gateway serves."""
        await asyncio.gather(*(watch.check_and_report() for watch in self.watches.values()))

    def _start_watches(self) -> None:
        for address, watch in self.watches.items():
            if address not in self.tasks:
                self.tasks[address] = asyncio.create_task(watch.run())

    async def run(self) -> None:
        """Watch every verifier; with a DNS target, look the name up again every period_s."""
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
        for verifier in [*self.pool.members.values(), *self.retired]:
            await verifier.channel.close()
