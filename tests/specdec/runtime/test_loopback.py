"""What counts as loopback (specdec/runtime/loopback.py): for a service's --host, and for a caller's address."""

from __future__ import annotations

import socket

import pytest

from specdec.runtime.loopback import is_loopback_host, is_loopback_peer


def non_loopback_address() -> str:
    """An IPv4 address of this machine that is not loopback ("" if it has none): the one its default route
    leaves from (a UDP connect sends nothing), else one its host name resolves to."""
    candidates = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.123", 9))  # TEST-NET-1: only the route is looked up
            candidates.append(probe.getsockname()[0])
        except OSError:
            pass
    try:
        candidates += socket.gethostbyname_ex(socket.gethostname())[2]
    except OSError:
        pass
    return next((a for a in candidates if not is_loopback_host(a) and a != "0.0.0.0"), "")


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "LOCALHOST",
                                  "[::ffff:127.0.0.1]", " 127.0.0.1 "])
def test_loopback_hosts(host):
    assert is_loopback_host(host)


@pytest.mark.parametrize("host", ["[::]", "::", "0.0.0.0", "", "192.0.2.2", "10.0.0.1", "fd00::2", "[fe80::1%eth0]",
                                  "[::ffff:10.0.0.1]", "no-such-host.invalid"])
def test_wildcards_other_addresses_and_unresolvable_names_are_not_loopback(host):
    assert not is_loopback_host(host)


def test_a_name_counts_by_what_it_resolves_to():
    address = non_loopback_address()
    if not address:
        pytest.skip("this machine has no non-loopback address")
    assert not is_loopback_host(address)


@pytest.mark.parametrize("peer,local", [
    ("ipv4:127.0.0.1:5000", True), ("ipv4:127.9.9.9:1", True), ("ipv6:[::1]:5000", True),
    ("ipv6:%5B::1%5D:5000", True), ("ipv6:[::ffff:127.0.0.1]:5000", True), ("unix:/tmp/socket", True),
    ("ipv4:192.0.2.2:5000", False), ("ipv6:[fd00::2]:5000", False), ("ipv6:%5Bfd00::2%5D:5000", False),
    ("ipv6:[::ffff:192.0.2.2]:5000", False), ("", False), ("weird", False),
])
def test_loopback_peers(peer, local):
    assert is_loopback_peer(peer) is local
