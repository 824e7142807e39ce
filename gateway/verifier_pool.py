"""The verifiers behind one gateway: who they are (--verifier), and which one takes the next request.

--verifier names them one of two ways:
- a comma-separated list of HOST:PORT (`a:50052,b:50052`): a fixed fleet;
- `dns:///NAME:PORT` (a Kubernetes headless Service): every address NAME resolves to, resolved again every
  --peer-check-s, so verifiers that come and go are picked up (gateway.verifier_watch.PoolWatch).
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
import dataclasses
import ipaddress
import itertools
import socket
import typing

import grpc

from specdec.runtime.grpc_server import ConfigError
from specdec.v1 import common_pb2, verifier_pb2_grpc

DNS_SCHEME = "dns:"


@dataclasses.dataclass(frozen=True)
class VerifierTargets:
    """What --verifier names: fixed addresses, or a DNS name (dns_host, dns_port) resolved to them."""

    addresses: tuple[str, ...] = ()
    dns_host: str = ""
    dns_port: int = 0

    @property
    def dns(self) -> bool:
        return bool(self.dns_host)

    def __str__(self) -> str:
        return f"dns:///{self.dns_host}:{self.dns_port}" if self.dns else ",".join(self.addresses)


def parse_targets(text: str) -> VerifierTargets:
    """--verifier -> VerifierTargets; ConfigError (exit 2 with the message) on one that cannot work."""
    text = text.strip()
    if text.startswith(DNS_SCHEME):
        name = text[len(DNS_SCHEME):]
        if name.startswith("//"):  # dns://[authority]/host:port, the authority (a DNS server) is not used
            name = name[2:].partition("/")[2]
        host, _, port = name.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536 or "," in name:
            raise ConfigError(f"--verifier {text!r}: a DNS target is dns:///NAME:PORT, e.g. "
                              "dns:///verifier-headless:50052 (one name, with its port)")
        return VerifierTargets(dns_host=host.strip("[]"), dns_port=int(port))
    addresses = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not addresses:
        raise ConfigError("--verifier is empty: give HOST:PORT, a list A:PORT,B:PORT, or dns:///NAME:PORT")
    for address in addresses:
        if "://" in address or address.startswith(DNS_SCHEME):
            raise ConfigError(f"--verifier {text!r}: {address!r} is not HOST:PORT; a DNS name is given alone, as "
                              "dns:///NAME:PORT")
    return VerifierTargets(addresses=addresses)


def host_port(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ipaddress.ip_address(ip).version == 6 else f"{ip}:{port}"


async def resolve(targets: VerifierTargets, loop) -> list[str]:
    """The addresses the targets stand for now, sorted; a DNS name is looked up (socket.gaierror if it fails)."""
    if not targets.dns:
        return list(targets.addresses)
    answers = await loop.getaddrinfo(targets.dns_host, targets.dns_port, type=socket.SOCK_STREAM)
    return sorted({host_port(sockaddr[0], targets.dns_port) for *_, sockaddr in answers})


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
