"""gateway.http_server: the HTTP API on uvicorn in our event loop, with the gRPC server's TLS flags.

Real sockets, real TLS (a throwaway CA) and a real verifier channel that finds
nobody listening: the verifier watch says so, and /health answers 503 with OpenAI's error object.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
import urllib.error
import urllib.request

import grpc
import pytest

from gateway.config import GatewayConfig
from gateway.generation import Generation
from gateway.http_server import ConnectionLimits, start_http, tls_options
from gateway.openai_api import ServedModel, create_app
from gateway.validation import ModelLimits
from gateway.verifier_watch import VerifierWatch
from specdec.runtime.config import ServerConfig
from specdec.runtime.grpc_server import ConfigError
from devkit.stack import free_port
from specdec.v1 import common_pb2
from tests.reliability.support import Certs

KEY = "sk-http-test"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return Certs(tmp_path_factory.mktemp("certs"))


def get(url: str, context: ssl.SSLContext | None = None, key: str = "") -> tuple[int, dict]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def client_context(certs: Certs, with_certificate: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs.ca))
    if with_certificate:
        context.load_cert_chain(str(certs.cert), str(certs.key))
    return context


def serve_and_call(server_cfg: ServerConfig, calls, limits: ConnectionLimits = ConnectionLimits()) -> list:
    """Start the HTTP API (verifier unreachable) on a free port, run the blocking `calls(port)`, stop it."""

    async def main():
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{free_port()}")  # nobody listens there
        generation = Generation(None, None, ModelLimits(100, 64), GatewayConfig())

        async def verifier_changed(problem, _info):  # as gateway/__main__.py does
            generation.verifier_problem = problem

        await VerifierWatch(channel, "nobody", common_pb2.ModelInfo(), 60, verifier_changed).check_and_report()
        app = create_app(generation, ServedModel("tiny", 64), [KEY])
        http = await start_http(app, server_cfg, 0, limits)
        try:
            return await asyncio.to_thread(calls, http.port)
        finally:
            await asyncio.wait_for(http.stop(), 10)
            await channel.close()

    return asyncio.run(main())


def test_plain_http_health_is_503_without_a_verifier_and_models_needs_the_key():
    def calls(port):
        base = f"http://127.0.0.1:{port}"
        return get(base + "/health"), get(base + "/v1/models"), get(base + "/v1/models", key=KEY)

    health, no_key, models = serve_and_call(ServerConfig(host="127.0.0.1", grace_s=1), calls)
    assert health[0] == 503 and health[1]["error"]["code"] == "service_unavailable"
    assert set(health[1]["error"]) == {"message", "type", "param", "code"}
    assert no_key[0] == 401 and no_key[1]["error"]["code"] == "invalid_api_key"
    assert models == (200, {"object": "list", "data": [
        {"id": "tiny", "object": "model", "created": models[1]["data"][0]["created"], "owned_by": "specdec",
         "max_model_len": 64}]})


def test_mutual_tls_from_the_grpc_flags(certs):
    server_cfg = ServerConfig(host="127.0.0.1", tls_cert=str(certs.cert), tls_key=str(certs.key),
                              tls_ca=str(certs.ca), grace_s=1)

    def calls(port):
        base = f"https://127.0.0.1:{port}"
        with_cert = get(base + "/v1/models", client_context(certs, True), key=KEY)
        refused = []
        for context in (client_context(certs, False), None):  # no client certificate; plain HTTP to a TLS port
            try:
                get(base.replace("https", "http") if context is None else base + "/v1/models", context, KEY)
            except (urllib.error.URLError, ssl.SSLError, ConnectionError) as exc:
                refused.append(type(exc).__name__)
        return with_cert, refused

    with_cert, refused = serve_and_call(server_cfg, calls)
    assert with_cert[0] == 200 and with_cert[1]["data"][0]["id"] == "tiny"
    assert len(refused) == 2, refused


def test_tls_without_client_certificates_when_not_required(certs):
    server_cfg = ServerConfig(host="127.0.0.1", tls_cert=str(certs.cert), tls_key=str(certs.key),
                              tls_ca=str(certs.ca), tls_require_client_cert=False, grace_s=1)
    status, _body = serve_and_call(server_cfg, lambda port: get(f"https://127.0.0.1:{port}/v1/models",
                                                                client_context(certs, False), KEY))
    assert status == 200
    assert tls_options(server_cfg)["ssl_cert_reqs"] == ssl.CERT_OPTIONAL


def seconds_until_closed(sock: socket.socket, limit_s: float = 8.0) -> float | None:
    """How long until the server closes `sock` (reads until EOF, discarding what comes); None if it stays open."""
    started = time.monotonic()
    sock.settimeout(limit_s)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - started


def test_idle_and_partial_header_sockets_are_closed_within_the_header_timeout():
    limits = ConnectionLimits(header_timeout_s=0.5)

    def calls(port):
        idle = socket.create_connection(("127.0.0.1", port))
        partial = socket.create_connection(("127.0.0.1", port))
        partial.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # the head never ends
        with idle, partial:
            return seconds_until_closed(idle), seconds_until_closed(partial)

    idle_s, partial_s = serve_and_call(ServerConfig(host="127.0.0.1", grace_s=1), calls, limits)
    assert idle_s is not None and partial_s is not None, "a socket without a complete request head stayed open"
    assert idle_s < 3 and partial_s < 3


def test_a_keep_alive_connection_is_closed_when_idle_and_its_next_head_is_timed_too():
    limits = ConnectionLimits(header_timeout_s=1.0, keep_alive_s=0.5)
    request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"

    def calls(port):
        with socket.create_connection(("127.0.0.1", port)) as idle, \
                socket.create_connection(("127.0.0.1", port)) as slow:
            idle.sendall(request)
            slow.sendall(request)
            slow.settimeout(5)
            assert slow.recv(65536).startswith(b"HTTP/1.1 503")  # answered; now a second head, unfinished
            slow.sendall(b"GET /health HTTP/1.1\r\n")
            return seconds_until_closed(idle), seconds_until_closed(slow)

    idle_s, slow_s = serve_and_call(ServerConfig(host="127.0.0.1", grace_s=1), calls, limits)
    assert idle_s is not None and idle_s < 3
    assert slow_s is not None and slow_s < 4


def test_connections_beyond_the_cap_are_closed_as_they_arrive():
    def calls(port):
        sockets = [socket.create_connection(("127.0.0.1", port)) for _ in range(6)]
        time.sleep(0.3)
        try:
            return [seconds_until_closed(sock, 1.0) is not None for sock in sockets]
        finally:
            for sock in sockets:
                sock.close()

    closed = serve_and_call(ServerConfig(host="127.0.0.1", grace_s=1), calls,
                            ConnectionLimits(header_timeout_s=30, max_connections=4))
    assert closed == [False] * 4 + [True] * 2


def test_a_busy_port_or_half_a_tls_pair_is_a_config_error():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(ConfigError, match="already in use"):
            asyncio.run(start_http(None, ServerConfig(host="127.0.0.1"), busy.getsockname()[1]))
    with pytest.raises(ConfigError, match="--tls-cert and --tls-key"):
        tls_options(ServerConfig(tls_cert="server.pem"))


def post(port: int, body: bytes, chunked: bool = False) -> tuple[int, dict]:
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    try:
        try:
            if chunked:
                connection.request("POST", "/v1/completions", body=iter([body[i:i + 65536]
                                                                          for i in range(0, len(body), 65536)]),
                                   headers=headers, encode_chunked=True)
            else:
                connection.request("POST", "/v1/completions", body=body, headers=headers)
        except (BrokenPipeError, ConnectionResetError):
            # A body refused mid-upload (past gateway.body_limit.DRAIN_BYTES, the server answers 413 and closes
            # while a client still sends): its answer is already here, read it as a client would.
            pass
        reply = connection.getresponse()
        return reply.status, json.loads(reply.read())
    finally:
        connection.close()


def test_bodies_larger_than_any_request_that_fits_are_refused_unread():
    """413 with OpenAI's error object, announced (Content-Length) or chunked; a body under the limit still
    reaches the API whole (its bad field is named)."""
    # limit: 64 tokens x 64 chars x 12 + 256 KiB + room for a structured-outputs constraint (6 x 64 KiB)
    big = json.dumps({"model": "tiny", "prompt": "x" * 1_000_000}).encode()

    def calls(port):
        return post(port, big), post(port, big, chunked=True), post(port, b'{"model": "tiny", "prompt": 5}'), \
            post(port, b'{"model": "tiny", "prompt": 5}', chunked=True)

    announced, chunked, small, small_chunked = serve_and_call(ServerConfig(host="127.0.0.1", grace_s=1), calls)
    for status, body in (announced, chunked):
        assert status == 413, body
        assert body["error"]["code"] == "body_too_large" and "refused unread" in body["error"]["message"]
    assert "the model's context is 64 tokens" in announced[1]["error"]["message"]
    for status, body in (small, small_chunked):
        assert status == 400 and body["error"]["param"].startswith("prompt"), body
