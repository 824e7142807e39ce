"""devkit.stack: the ports test stacks listen on."""

import socket

from devkit.stack import _ephemeral_low, free_port


def test_free_ports_come_from_below_the_ephemeral_range_and_are_never_handed_out_twice():
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(1024 < port < _ephemeral_low() for port in ports)  # no client connection's local port lands there
    for port in ports[:5]:  # each can be listened on
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_xdist_workers_draw_from_disjoint_ranges(monkeypatch):
    drawn = {}
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
        drawn[worker] = [free_port() for _ in range(20)]
    assert max(drawn["gw0"]) < min(drawn["gw1"])
