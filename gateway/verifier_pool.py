"""The verifiers behind one gateway: who they are (--verifier), and which one takes the next request.

--verifier names them as specdec.runtime.targets reads a fleet: a comma-separated list of HOST:PORT, or
`dns:///NAME:PORT` (a Kubernetes headless Service) resolved again every --peer-check-s, so verifiers that come
and go are picked up (gateway.verifier_watch.PoolWatch).
Each verifier gets its own channel, so the gateway sees each one's health and in-flight calls apart.

Picking: least outstanding requests over the usable verifiers, ties taken in turn. A request is one
server-streaming Decode call that holds its verifier (its KV cache) from the first token to the last, and
those calls differ a hundredfold in length (8 tokens or 4,000). round_robin spreads call *starts* evenly, so
a verifier that drew a few long streams keeps them while getting its equal share of new ones: the load
drifts apart. gRPC's own round_robin (or pick_first over a headless Service) cannot do better: it sees
subchannels, not how many streams each still carries. Counting the open calls per verifier here and sending
the next one to the least loaded keeps the load even whatever the lengths, at the cost of one counter per
verifier.
"""

from __future__ import annotations

import contextlib
import itertools
import typing

import grpc

from specdec.runtime import targets
from specdec.runtime.targets import Targets, resolve  # noqa: F401 (resolve: the pool's callers take it from here)
from specdec.v1 import common_pb2, verifier_pb2_grpc

VerifierTargets = Targets


def parse_targets(text: str) -> Targets:
    """--verifier -> Targets; ConfigError (exit 2 with the message) on one that cannot work."""
    return targets.parse_targets(text, "--verifier", "verifier-headless:50052")


class Verifier:
    """One verifier: its channel, whether it is usable (problem None) and how many requests it carries now."""

    def __init__(self, address: str, channel: grpc.aio.Channel):
        self.address = address
        self.channel = channel
        self.stub = verifier_pb2_grpc.VerifierServiceStub(channel)
        self.problem: str | None = None  # why it is out of the pool; None while usable
        self.info: common_pb2.ModelInfo | None = None  # its ModelInfo, as last checked
        self.outstanding = 0  # Decode calls open on it
        # Called when a call to it failed as if it went away: its watch takes it out and checks it at once.
        self.suspect: typing.Callable[[str], typing.Awaitable[None]] | None = None

    def __repr__(self) -> str:
        return f"Verifier({self.address}, outstanding={self.outstanding}, problem={self.problem!r})"


class VerifierPool:
    """The verifiers a gateway may send requests to; `pick` chooses one, `lease` counts the call on it."""

    def __init__(self, verifiers: typing.Iterable[Verifier] = ()):
        self.members: dict[str, Verifier] = {v.address: v for v in verifiers}
        self._turn = itertools.count()

    def add(self, verifier: Verifier) -> None:
        self.members[verifier.address] = verifier

    def remove(self, address: str) -> Verifier | None:
        return self.members.pop(address, None)

    def usable(self) -> list[Verifier]:
        return [v for v in self.members.values() if v.problem is None]

    def pick(self, avoid: typing.Container[Verifier] = ()) -> Verifier | None:
        """The usable verifier with the fewest open calls (ties in turn), not one in `avoid`; None if none."""
        candidates = [v for v in self.usable() if v not in avoid]
        if not candidates:
            return None
        least = min(v.outstanding for v in candidates)
        tied = [v for v in candidates if v.outstanding == least]
        return tied[next(self._turn) % len(tied)]

    @contextlib.contextmanager
    def lease(self, verifier: Verifier) -> typing.Iterator[verifier_pb2_grpc.VerifierServiceStub]:
        """Count one open call on `verifier` while the block runs; yields its stub."""
        verifier.outstanding += 1
        try:
            yield verifier.stub
        finally:
            verifier.outstanding -= 1

    def problem(self) -> str | None:
        """None while at least one verifier is usable; otherwise why none is (the gateway's health reports it)."""
        if self.usable():
            return None
        if not self.members:
            return "no verifier is known yet (--verifier resolved to no address); retry shortly"
        if len(self.members) == 1:
            return next(iter(self.members.values())).problem
        reasons = "; ".join(v.problem or "" for v in self.members.values())
        return f"none of the {len(self.members)} verifiers is usable: {reasons}"

    @classmethod
    def of_channel(cls, address: str, channel: grpc.aio.Channel) -> VerifierPool:
        """A pool of one verifier, usable from the start (tests, tools)."""
        return cls([Verifier(address, channel)])
