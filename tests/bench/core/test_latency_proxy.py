"""bench.core.latency_proxy: the one-way delay it adds, in order, and its loopback-only rule."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from bench.core.latency_proxy import LatencyProxy


def echo_server() -> tuple[socket.socket, int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            while data := conn.recv(65536):
                conn.sendall(data)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


def round_trip_ms(address: str, payload: bytes = b"x") -> tuple[float, bytes]:
    host, port = address.split(":")
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        started = time.perf_counter()
        conn.sendall(payload)
        got = b""
        while len(got) < len(payload):
            got += conn.recv(65536)
        return (time.perf_counter() - started) * 1000, got


def test_a_round_trip_takes_twice_the_one_way_delay_and_bytes_keep_their_order():
    server, port = echo_server()
    try:
        with LatencyProxy(f"127.0.0.1:{port}", delay_ms=10) as proxy:
            direct, _ = round_trip_ms(f"127.0.0.1:{port}")
            delayed, _ = round_trip_ms(proxy.address)
            payload = bytes(range(256)) * 2000  # 512 KB in many chunks
            _, echoed = round_trip_ms(proxy.address, payload)
            proxy.delay_ms = 0
            undelayed, _ = round_trip_ms(proxy.address)
        print(f"figure: round trip direct {direct:.2f} ms, through the proxy at 10 ms each way {delayed:.1f} ms, "
              f"at 0 ms {undelayed:.2f} ms")
        assert 19 <= delayed < 60
        assert undelayed < 15
        assert echoed == payload
    finally:
        server.close()


def test_it_forwards_only_to_loopback():
    with pytest.raises(ValueError, match="only to loopback"):
        LatencyProxy("10.1.2.3:80")
