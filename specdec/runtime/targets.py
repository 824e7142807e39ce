"""What a flag that names a fleet of peers stands for: fixed addresses, or a DNS name resolved to them.

Such a flag (the gateway's --verifier, the verifier's --draft) names its peers one of two ways:
- a comma-separated list of HOST:PORT (`a:50052,b:50052`): a fixed fleet;
- `dns:///NAME:PORT` (a Kubernetes headless Service): every address NAME resolves to, resolved again while
  serving, so peers that come and go are picked up (specdec.runtime.peer_watch.PoolWatch).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket

from specdec.runtime.grpc_server import ConfigError

DNS_SCHEME = "dns:"


@dataclasses.dataclass(frozen=True)
class Targets:
    """Fixed addresses, or a DNS name (dns_host, dns_port) resolved to them."""

    addresses: tuple[str, ...] = ()
    dns_host: str = ""
    dns_port: int = 0

    @property
    def dns(self) -> bool:
        return bool(self.dns_host)

    def __str__(self) -> str:
        return f"dns:///{self.dns_host}:{self.dns_port}" if self.dns else ",".join(self.addresses)


def parse_targets(text: str, flag: str, example: str) -> Targets:
    """The flag's value -> Targets; ConfigError (exit 2 with the message) on one that cannot work.
    flag: the flag's name, for the message; example: a NAME:PORT the message shows (`verifier-headless:50052`)."""
    text = text.strip()
    if text.startswith(DNS_SCHEME):
        name = text[len(DNS_SCHEME):]
        if name.startswith("//"):  # dns://[authority]/host:port, the authority (a DNS server) is not used
            name = name[2:].partition("/")[2]
        host, _, port = name.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536 or "," in name:
            raise ConfigError(f"{flag} {text!r}: a DNS target is dns:///NAME:PORT, e.g. dns:///{example} (one name, "
                              "with its port)")
        return Targets(dns_host=host.strip("[]"), dns_port=int(port))
    addresses = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not addresses:
        raise ConfigError(f"{flag} is empty: give HOST:PORT, a list A:PORT,B:PORT, or dns:///NAME:PORT")
    for address in addresses:
        if "://" in address or address.startswith(DNS_SCHEME):
            raise ConfigError(f"{flag} {text!r}: {address!r} is not HOST:PORT; a DNS name is given alone, as "
                              "dns:///NAME:PORT")
    return Targets(addresses=addresses)


def host_port(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ipaddress.ip_address(ip).version == 6 else f"{ip}:{port}"


async def resolve(targets: Targets, loop) -> list[str]:
    """The addresses the targets stand for now, sorted; a DNS name is looked up (socket.gaierror if it fails)."""
    if not targets.dns:
        return list(targets.addresses)
    answers = await loop.getaddrinfo(targets.dns_host, targets.dns_port, type=socket.SOCK_STREAM)
    return sorted({host_port(sockaddr[0], targets.dns_port) for *_, sockaddr in answers})
