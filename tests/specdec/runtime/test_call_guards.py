"""What every server and channel wraps around calls (specdec/runtime/interceptors.py, wired in specdec/runtime/grpc_server.py):
undecodable requests, the internal token, stream clean-up on cancel; and where /metrics binds, and log lines
that a client's string cannot break. Closed by default: where the internal services listen, the refusal of an
open bind, and whose tenant is trusted.

A real DraftService runs in this process (tests/draft_service/inprocess.py); the calls are real gRPC calls.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import pathlib

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specdec.runtime import grpc_server
from specdec.runtime import metrics
from specdec.runtime.config import ServerConfig
from specdec.runtime.interceptors import INTERNAL_TOKEN_KEY
from draft_service.config import DraftConfig
from draft_service.ngram import NgramProposer
from draft_service.server import DraftServicer
from specdec.v1 import draft_pb2, draft_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from tests.draft_service import inprocess
from tests.draft_service.inprocess import draft_server
from tests.grpc_streams import replies
from tests.log_records import logged_errors

TOKEN = "internal-token-for-tests-3f9a1c"
BAD_UTF8 = b"\xff\xfe"


def field_1(payload: bytes) -> bytes:
    """A message whose field 1 (length-delimited) holds `payload`."""
    return b"\x0a" + bytes([len(payload)]) + payload


async def raw(channel, kind: str, method: str, payload: bytes, metadata=()):
    if kind == "unary":
        return await channel.unary_unary(method)(payload, timeout=10, metadata=metadata)
    if kind == "server-stream":
        return [m async for m in channel.unary_stream(method)(payload, timeout=10, metadata=metadata)]
    return await replies(channel.stream_stream(method)(timeout=10, metadata=metadata), [payload])


# (kind, method, a message with invalid UTF-8 in a string field)
UNDECODABLE = [
    ("unary", "/grpc.health.v1.Health/Check", field_1(BAD_UTF8)),  # service
    ("server-stream", "/grpc.health.v1.Health/Watch", field_1(BAD_UTF8)),
    ("bidi", "/specdec.v1.DraftService/Propose", field_1(field_1(BAD_UTF8))),  # start.request_id
]


@pytest.mark.parametrize("kind,method,payload", UNDECODABLE, ids=[k for k, _, _ in UNDECODABLE])
def test_undecodable_requests_are_invalid_argument_without_a_traceback(kind, method, payload, caplog):
    async def scenario():
        async with draft_server() as (address, _):
            async with grpc.aio.insecure_channel(address) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await raw(channel, kind, method, payload)
                assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value.details()
                assert "bad UTF-8" in raised.value.details()
                # and the server still answers
                reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING

    with caplog.at_level(logging.INFO):
        asyncio.run(scenario())
    assert logged_errors(caplog.records) == []


def test_internal_services_need_the_token_and_health_stays_open(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    secure = ServerConfig(host="127.0.0.1", internal_token_file=str(token_file))
    start = draft_pb2.ProposeRequest(start=draft_pb2.StartSequence(request_id="r", prompt_token_ids=[1, 2, 3]))

    async def scenario():
        async with draft_server(secure) as (address, _):
            async with grpc.aio.insecure_channel(address) as channel:
                stub = draft_pb2_grpc.DraftServiceStub(channel)
                for metadata in [(), ((INTERNAL_TOKEN_KEY, TOKEN[:-1]),), (("authorization", f"Bearer {TOKEN}"),)]:
                    for call in (lambda: stub.GetDraftInfo(draft_pb2.GetDraftInfoRequest(), metadata=metadata),
                                 lambda: replies(stub.Propose(metadata=metadata), [start])):
                        with pytest.raises(grpc.aio.AioRpcError) as raised:
                            await call()
                        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
                        assert "--internal-token-file" in raised.value.details()
                        assert TOKEN not in raised.value.details()
                health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
                assert health.status == health_pb2.HealthCheckResponse.SERVING
            # a peer's channel (open_channel) with the same token file is let in
            channel = grpc_server.open_channel(address, secure)
            try:
                info = await draft_pb2_grpc.DraftServiceStub(channel).GetDraftInfo(draft_pb2.GetDraftInfoRequest())
                assert info.method == "ngram"
                answers = await replies(draft_pb2_grpc.DraftServiceStub(channel).Propose(), [start])
                assert answers == []
            finally:
                await channel.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("content,words", [("", "is empty"), ("short", "at least 16"),
                                           ("has a space in it somewhere", "without spaces")])
def test_a_bad_token_file_is_a_config_error(tmp_path, content, words):
    path = tmp_path / "token"
    path.write_text(content)
    with pytest.raises(grpc_server.ConfigError, match=words):
        grpc_server.internal_token(ServerConfig(internal_token_file=str(path)))
    with pytest.raises(grpc_server.ConfigError, match="cannot read"):
        grpc_server.internal_token(ServerConfig(internal_token_file=str(tmp_path / "missing")))


def test_cancelled_streams_end_cleanly(caplog):
    """A client cancels a response stream while the server is sending (the servicer's generator waits at a
    `yield`): its clean-up runs at once, and nothing logs an ERROR. Left to the garbage collector, the stream was
    closed in another task, where OpenTelemetry could not detach the span's context ("Failed to detach
    context", with a traceback, twice per cancelled call)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    trace.set_tracer_provider(TracerProvider())  # recording spans, as in the services
    cleaned_up = []

    async def forever(request, context):
        try:
            while True:
                yield b"x" * 1000
        finally:
            cleaned_up.append(True)

    def register(server):
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "test.Streams", {"Forever": grpc.unary_stream_rpc_method_handler(forever)}),))

    async def scenario():
        running = await grpc_server.start_server(ServerConfig(host="127.0.0.1"), register, [])
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
                for _ in range(20):
                    call = channel.unary_stream("/test.Streams/Forever")(b"", timeout=10)
                    received = 0
                    async for _ in call:
                        received += 1
                        if received == 5:
                            call.cancel()
                            break
                for _ in range(100):
                    if len(cleaned_up) == 20:
                        break
                    await asyncio.sleep(0.02)
        finally:
            await running.stop(0)

    with caplog.at_level(logging.INFO):
        asyncio.run(scenario())
    assert len(cleaned_up) == 20
    assert logged_errors(caplog.records) == []


def listening_address(port: int) -> str:
    """The local address a socket listens on at `port` (from /proc/net/tcp), e.g. '127.0.0.1'."""
    for line in pathlib.Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, port_hex = local.split(":")
        if state == "0A" and int(port_hex, 16) == port:
            return ".".join(str(b) for b in reversed(bytes.fromhex(address)))
    return ""


def test_metrics_bind_to_the_services_host():
    assert listening_address(metrics.serve(0, "127.0.0.1")) == "127.0.0.1"
    assert listening_address(metrics.serve(0, "[::]")) == "0.0.0.0"


def test_log_lines_cannot_be_forged():
    forged = "abc\n2026-01-01 00:00:00,000 CRITICAL root: forged\r\x1b[31m\u2028"
    record = logging.LogRecord("verifier", logging.WARNING, __file__, 1, "request %s: dropped", (forged,), None)
    text = grpc_server.TextFormatter("%(levelname)s %(name)s: %(message)s").format(record)
    assert "\n" not in text and "\r" not in text and "\x1b" not in text and "\u2028" not in text
    assert text == ("WARNING verifier: request abc\\n2026-01-01 00:00:00,000 CRITICAL root: forged\\r\\x1b[31m"
                    "\\u2028: dropped")
    line = grpc_server.JsonFormatter().format(record)
    assert "\n" not in line and "\u2028" not in line
    assert json.loads(line)["message"] == f"request {forged}: dropped"


def test_setup_logging_json(capsys):
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = []
    try:
        grpc_server.setup_logging("INFO", "json")
        stream = io.StringIO()
        root.handlers[0].setStream(stream)
        logging.getLogger("draft_service").warning("request %s", "x\ny")
    finally:
        root.handlers = saved
    line = stream.getvalue()
    assert line.count("\n") == 1
    assert json.loads(line) | {"time": ""} == {"time": "", "level": "WARNING", "logger": "draft_service",
                                                "message": "request x\ny"}


# ---------------------------------------------------------------- closed by default


def test_internal_services_listen_on_loopback_unless_told_and_the_gateway_everywhere():
    """`python -m draft_service` / `verifier_service` bare: loopback; the gateway is the public front door."""
    from draft_service.__main__ import DEFAULTS as DRAFT
    from draft_service.config import DraftConfig
    from gateway.__main__ import DEFAULTS as GATEWAY
    from gateway.config import GatewayConfig
    from specdec.runtime import config as specdec_config
    from specdec.runtime.loopback import is_loopback_host
    from verifier_service.__main__ import DEFAULTS as VERIFIER
    from verifier_service.config import VerifierConfig

    hosts = {name: specdec_config.parse([ServerConfig, config], "", [], defaults=defaults)[0].host
             for name, config, defaults in [("draft", DraftConfig, DRAFT), ("verifier", VerifierConfig, VERIFIER),
                                            ("gateway", GatewayConfig, GATEWAY)]}
    assert is_loopback_host(hosts["draft"]) and is_loopback_host(hosts["verifier"]), hosts
    assert hosts["gateway"] == "[::]"
    for config in (DraftConfig, VerifierConfig):  # --insecure is theirs, off by default
        assert specdec_config.parse([ServerConfig, config], "", ["--insecure", "true"])[1].insecure
        assert not config().insecure


@pytest.mark.parametrize("host", ["[::]", "0.0.0.0", "192.0.2.2", ""])
def test_an_open_bind_needs_the_token_mtls_or_insecure(tmp_path, host):
    with pytest.raises(grpc_server.ConfigError, match=r"refusing to serve on --host .*--internal-token-file.*"
                                                       r"--insecure"):
        grpc_server.check_internal_exposure(ServerConfig(host=host), insecure=False)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    for allowed in [ServerConfig(host=host, internal_token_file=str(token_file)),
                    ServerConfig(host=host, tls_cert="c.pem", tls_key="k.pem", tls_ca="ca.pem")]:
        grpc_server.check_internal_exposure(allowed, insecure=False)
    grpc_server.check_internal_exposure(ServerConfig(host=host), insecure=True)
    # TLS without client certificates authenticates no caller
    with pytest.raises(grpc_server.ConfigError):
        grpc_server.check_internal_exposure(ServerConfig(host=host, tls_cert="c", tls_key="k", tls_ca="ca",
                                                         tls_require_client_cert=False), insecure=False)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]"])
def test_a_loopback_bind_needs_nothing(host):
    grpc_server.check_internal_exposure(ServerConfig(host=host), insecure=False)


class _RecordingVerifier(verifier_pb2_grpc.VerifierServiceServicer):
    def __init__(self):
        self.tenants = []

    async def Decode(self, request, context):
        self.tenants.append(request.tenant)
        yield verifier_pb2.DecodeResponse(token_ids=[1])


class _RecordingNgram(NgramProposer):
    def __init__(self):
        super().__init__()
        self.tenants = []

    def start(self, prompt_ids, sampling, return_probs, tenant=""):
        self.tenants.append(tenant)
        return super().start(prompt_ids, sampling, return_probs, tenant)


def test_a_tenant_is_trusted_only_from_an_authenticated_peer(tmp_path, caplog):
    """A server on every interface without the token (--insecure): a tenant from loopback is kept, one from
    another address becomes the shared tenant "" (logged once); with the token, every caller that gets in
    presented it, so its tenant is kept."""
    from tests.specdec.runtime.test_loopback import non_loopback_address

    outside = non_loopback_address()
    if not outside:
        pytest.skip("this machine has no non-loopback address to call from")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    decode = verifier_pb2.DecodeRequest(prompt_token_ids=[1, 2], max_tokens=1, tenant="tenant-a")
    start = draft_pb2.ProposeRequest(start=draft_pb2.StartSequence(request_id="r", prompt_token_ids=[1, 2, 3],
                                                                   tenant="tenant-a"))

    async def calls(port: int, metadata=()) -> None:
        for via in ("127.0.0.1", outside, outside):
            async with grpc.aio.insecure_channel(f"{via}:{port}") as channel:
                await replies(draft_pb2_grpc.DraftServiceStub(channel).Propose(metadata=metadata), [start])
                [reply async for reply in verifier_pb2_grpc.VerifierServiceStub(channel).Decode(
                    decode, metadata=metadata, timeout=10)]

    async def scenario(config: ServerConfig, metadata=()) -> tuple[list, list]:
        proposer, verifier = _RecordingNgram(), _RecordingVerifier()

        def register(server):
            draft_pb2_grpc.add_DraftServiceServicer_to_server(
                DraftServicer(proposer, inprocess.INFO, DraftConfig()), server)
            verifier_pb2_grpc.add_VerifierServiceServicer_to_server(verifier, server)

        running = await grpc_server.start_server(config, register, [])
        try:
            await calls(running.port, metadata)
        finally:
            await running.stop(0)
        return proposer.tenants, verifier.tenants

    with caplog.at_level(logging.INFO):
        assert asyncio.run(scenario(ServerConfig(host="[::]"))) == (["tenant-a", "", ""], ["tenant-a", "", ""])
    warnings = [r.getMessage() for r in caplog.records if "nothing authenticates it" in r.getMessage()]
    assert len(warnings) == 1 and "tenant-a" not in warnings[0], warnings
    secure = ServerConfig(host="[::]", internal_token_file=str(token_file))
    assert asyncio.run(scenario(secure, ((INTERNAL_TOKEN_KEY, TOKEN),))) == (["tenant-a"] * 3, ["tenant-a"] * 3)
