"""Start a gRPC aio server with health, reflection, tracing, TLS and the internal token; stop it gracefully.

Every service serves grpc.health.v1 and server reflection. Shutdown follows the
gRPC examples: health NOT_SERVING first, then drain in-flight calls, then stop.
Every server parses requests without tracebacks and closes response streams in
their own task (`specdec.runtime.interceptors`); with --internal-token-file, every
channel sends the token and the internal services require it. Without it, an
internal service serves on loopback only unless --insecure
(`check_internal_exposure`), and trusts a caller's tenant only from loopback or
a verified client certificate.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import pathlib
import signal
import typing

import grpc
from grpc_health.v1 import _async as health_async
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from specdec.runtime import interceptors as call_interceptors
from specdec.runtime import limits
from specdec.runtime import loopback
from specdec.runtime import telemetry
from specdec.runtime.config import ServerConfig

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A configuration problem a person can fix; its message says how."""


def _read(path: str, what: str) -> bytes:
    try:
        return pathlib.Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path!r}: {exc.strerror}") from exc


def internal_token(config: ServerConfig) -> str:
    """The shared service-to-service token from --internal-token-file ("" when unset)."""
    if not config.internal_token_file:
        return ""
    token = _read(config.internal_token_file, "--internal-token-file").decode("utf-8", "replace").strip()
    fix = (f"write one random token into {config.internal_token_file}, the same for every service "
           "(e.g. `openssl rand -hex 32`)")
    if not token:
        raise ConfigError(f"--internal-token-file {config.internal_token_file} is empty: {fix}")
    if len(token) < 16 or not all("!" <= c <= "~" for c in token):
        raise ConfigError(f"the internal token in {config.internal_token_file} must be at least 16 printable ASCII "
                          f"characters without spaces: {fix}")
    return token


def callers_authenticated(config: ServerConfig) -> bool:
    """Whether every call to an internal service proves where it comes from: the internal token, or a client
    certificate from --tls-ca (mTLS)."""
    return bool(config.internal_token_file or (config.tls_ca and config.tls_cert and config.tls_require_client_cert))


def check_internal_exposure(config: ServerConfig, insecure: bool) -> None:
    """An internal service (verifier, draft) refuses to serve unauthenticated callers beyond loopback unless told
    to (--insecure): the port would let anyone decode, and read what the draft learnt from other users."""
    if callers_authenticated(config) or loopback.is_loopback_host(config.host):
        return
    if insecure:
        log.warning("--insecure: serving on --host %s without authenticating callers; anyone who can reach the port "
                    "can use this service", config.host)
        return
    raise ConfigError(f"refusing to serve on --host {config.host}: it is reachable from other machines and nothing "
                      "authenticates callers; set --internal-token-file (the same token on every service) or mTLS "
                      "(--tls-cert, --tls-key, --tls-ca), or bind loopback (--host 127.0.0.1), or pass --insecure "
                      "to serve it open")


def message_options(config: ServerConfig, max_receive_bytes: int = 0) -> list[tuple[str, int]]:
    """gRPC's message caps: --max-message-mb, and at most max_receive_bytes received when given."""
    limit = config.max_message_mb * 1024 * 1024
    receive = min(limit, max_receive_bytes) if max_receive_bytes else limit
    return [("grpc.max_receive_message_length", receive), ("grpc.max_send_message_length", limit)]


# Requests up to this size that cannot fit are read and refused with INVALID_ARGUMENT and a message that says
# why; larger ones (and any over twice what fits) are refused by gRPC itself with RESOURCE_EXHAUSTED before
# they are buffered: reading a message that large only to name the field would cost memory per concurrent caller.
READ_TO_EXPLAIN_BYTES = 4 * 1024 * 1024


def server_credentials(config: ServerConfig) -> grpc.ServerCredentials | None:
    """TLS when a certificate and key are set; mutual TLS when a CA is set too."""
    if not (config.tls_cert or config.tls_key):
        return None
    if not (config.tls_cert and config.tls_key):
        raise ConfigError("TLS needs both --tls-cert and --tls-key")
    ca = _read(config.tls_ca, "--tls-ca") if config.tls_ca else None
    return grpc.ssl_server_credentials(
        [(_read(config.tls_key, "--tls-key"), _read(config.tls_cert, "--tls-cert"))],
        root_certificates=ca,
        require_client_auth=ca is not None and config.tls_require_client_cert,
    )


def channel_credentials(config: ServerConfig) -> grpc.ChannelCredentials | None:
    """For calls to peers: TLS when a CA is set, presenting our own certificate (mTLS) if we have one."""
    if not config.tls_ca:
        return None
    cert = _read(config.tls_cert, "--tls-cert") if config.tls_cert else None
    key = _read(config.tls_key, "--tls-key") if config.tls_key else None
    return grpc.ssl_channel_credentials(_read(config.tls_ca, "--tls-ca"), key, cert)


# Peers are services that restart (or are still starting): retry the connection every 2 s at most, not at
# gRPC's default backoff, which grows to 120 s and so finds a peer that came up seconds ago only much later.
RECONNECT_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 250), ("grpc.min_reconnect_backoff_ms", 250),
                     ("grpc.max_reconnect_backoff_ms", 2_000)]


def open_channel(target: str, config: ServerConfig, tls_name: str = "") -> grpc.aio.Channel:
    """A traced aio channel to a peer, over TLS when configured, sending the internal token when set.

    tls_name: the name the peer's certificate is checked against, when target is one of its IP addresses
    (a DNS name the caller resolved itself); default: the target's host."""
    options = message_options(config) + RECONNECT_OPTIONS + [
        ("grpc.enable_retries", 1), ("grpc.keepalive_time_ms", 30_000),
        # behind a headless Service, each call (a whole sequence) picks a replica
        ("grpc.lb_policy_name", "round_robin")]
    if tls_name:
        options.append(("grpc.ssl_target_name_override", tls_name))
    credentials = channel_credentials(config)
    interceptors = telemetry.client_interceptors()
    token = internal_token(config)
    if token:
        interceptors += call_interceptors.internal_token_interceptors(token)
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
    return grpc.aio.secure_channel(target, credentials, options=options, interceptors=interceptors)


@dataclasses.dataclass
class RunningServer:
    server: grpc.aio.Server
    port: int
    health: health_async.HealthServicer
    service_names: list[str]

    async def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ["", *self.service_names]:
            await self.health.set(name, status)

    async def stop(self, grace_s: float) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)


async def start_server(
    config: ServerConfig,
    register: typing.Callable[[grpc.aio.Server], None],
    service_names: list[str],
    interceptors: typing.Sequence[grpc.aio.ServerInterceptor] = (),
    request_size: call_interceptors.RequestSizeLimit | None = None,
) -> RunningServer:
    """Bind, register the services plus health and reflection, start, and report SERVING.

    request_size: requests larger than what the service can use are refused unread (INVALID_ARGUMENT)."""
    token = internal_token(config)
    guards = ([call_interceptors.RequireInternalToken(token)] if token
              else [call_interceptors.TenantFromAuthenticatedPeers(log)])
    # outermost first: CloseStreams must wrap the tracing span, ParseRequests sits next to the servicer
    server = grpc.aio.server(
        interceptors=[call_interceptors.CloseStreams(), *telemetry.server_interceptors(), *guards, *interceptors,
                      call_interceptors.ParseRequests(request_size or call_interceptors.RequestSizeLimit())],
        options=message_options(config, max(READ_TO_EXPLAIN_BYTES, 2 * request_size.max_bytes)
                                if request_size and request_size.max_bytes else 0),
    )
    register(server)
    health = health_async.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection([*service_names, reflection.SERVICE_NAME, "grpc.health.v1.Health"], server)
    address = f"{config.host}:{config.port}"
    credentials = server_credentials(config)
    try:
        port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    except RuntimeError as exc:
        raise ConfigError(f"cannot listen on {address}: {exc}; is the port already in use?") from exc
    await server.start()
    running = RunningServer(server, port, health, service_names)
    await running.set_serving(True)
    return running


async def wait_for_signal() -> None:
    """Return on SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def escape_controls(text: str) -> str:
    """One log line whatever a client put in the message: control characters become escapes (\\n, \\x1b)."""
    return limits.CONTROL_CHARACTERS.sub(lambda match: match.group().encode("unicode_escape").decode("ascii"), text)


class TextFormatter(logging.Formatter):
    """The usual text line, with control characters in the message escaped (a traceback keeps its lines)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.message)
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and exception, as text)."""

    def format(self, record: logging.LogRecord) -> str:
        line = {"time": self.formatTime(record), "level": record.levelname, "logger": record.name,
                "message": record.getMessage()}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line)  # ASCII: non-ASCII line separators (U+2028, NEL) are escaped too


def setup_logging(level: str, log_format: str = "text") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json"
                         else TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])
    logging.getLogger("httpx").setLevel(logging.WARNING)
