"""What counts as loopback: for a service's --host (closed by default) and for a caller's address (trusted).

Loopback is 127.0.0.0/8 and ::1 (an IPv4-mapped ::ffff:127.x too). A wildcard ("[::]", "0.0.0.0", "")
listens on every interface, so it is not loopback. A name counts when every address it resolves to is
loopback: gRPC binds exactly those addresses, so `localhost` (and a host name that /etc/hosts maps to
127.0.1.1) stays on this machine, and a name that does not resolve is not taken on trust.
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse


def _loopback_address(text: str) -> bool | None:
    """True/False for an IP literal, None for anything else (a name)."""
    try:
        address = ipaddress.ip_address(text.split("%")[0])  # fe80::1%eth0: the zone names an interface
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def is_loopback_host(host: str) -> bool:
    """Whether a server bound to `host` (the --host value, brackets allowed) is reachable from this machine only."""
    name = host.strip().removeprefix("[").removesuffix("]")
    if not name:
        return False  # ":port" binds every interface
    literal = _loopback_address(name)
    if literal is not None:
        return literal
    try:
        resolved = {info[4][0] for info in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)}
    except (OSError, UnicodeError):
        return False
    return bool(resolved) and all(_loopback_address(address) for address in resolved)


def is_loopback_peer(peer: str) -> bool:
    """Whether a call came from this machine, from gRPC's peer string: "ipv4:127.0.0.1:5000",
    "ipv6:[::1]:5000" (or "ipv6:%5B::1%5D:5000"), "unix:/path" (a Unix socket is local by construction)."""
    kind, _, rest = urllib.parse.unquote(peer).partition(":")  # gRPC may escape the brackets: %5B::1%5D
    if kind in ("unix", "unix-abstract"):
        return True
    if kind == "ipv4":
        return bool(_loopback_address(rest.rpartition(":")[0]))
    if kind == "ipv6":
        return bool(_loopback_address(rest.rpartition(":")[0].removeprefix("[").removesuffix("]")))
    return False
