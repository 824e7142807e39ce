"""Serve an ASGI app with uvicorn in the running event loop, beside the gRPC server, with its TLS flags.

The process keeps its own signal handling (specdec.runtime.service_main): uvicorn's is
turned off and the server is stopped through `RunningHttp.stop`, which lets
in-flight responses finish for up to the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import resource
import socket
import ssl

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from specdec.runtime.config import ServerConfig
from specdec.runtime.grpc_server import ConfigError

log = logging.getLogger(__name__)


class EmbeddedServer(uvicorn.Server):
    """uvicorn that leaves SIGINT/SIGTERM to the process (it would otherwise replace the loop's handlers)."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


@dataclasses.dataclass(frozen=True)
class ConnectionLimits:
    """What one HTTP connection may hold: the time to send a request head, the idle time between requests, and
    how many connections may be open at once (each is a file descriptor, shared with the gRPC server)."""

    header_timeout_s: float = 10.0
    keep_alive_s: float = 5.0
    max_connections: int = 0  # 0: a quarter of the open-file limit

    def connection_cap(self) -> int:
        if self.max_connections > 0:
            return self.max_connections
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        return max(16, (soft if soft != resource.RLIM_INFINITY else 65536) // 4)


def bounded_protocol(limits: ConnectionLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a request-head deadline and a cap on open connections.

    uvicorn times out only the idle time after a response; a connection that never sends a complete request
    head (an idle socket, or headers sent a byte at a time) would stay open for good. Here the head must be
    complete within header_timeout_s of the connection opening or of its last response."""
    cap = limits.connection_cap()

    class BoundedH11Protocol(H11Protocol):
        head_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport):
            super().connection_made(transport)
            if len(self.connections) > cap:
                log.warning("HTTP connection from %s closed: %d connections are open (--http-max-connections)",
                            self.client, cap)
                transport.close()
                return
            self.arm_head_deadline()

        def connection_lost(self, exc):
            self.disarm_head_deadline()
            super().connection_lost(exc)

        def on_response_complete(self):
            super().on_response_complete()
            if not self.transport.is_closing():
                self.arm_head_deadline()

        def arm_head_deadline(self):
            self.disarm_head_deadline()
            self.head_deadline = self.loop.call_later(limits.header_timeout_s, self.head_deadline_passed)

        def disarm_head_deadline(self):
            if self.head_deadline is not None:
                self.head_deadline.cancel()
                self.head_deadline = None

        def head_deadline_passed(self):
            self.head_deadline = None
            waiting_for_head = self.conn.their_state is h11.IDLE and (self.cycle is None or self.cycle.response_complete)
            if waiting_for_head and not self.transport.is_closing():
                self.transport.close()

    return BoundedH11Protocol


@dataclasses.dataclass
class RunningHttp:
    server: EmbeddedServer
    task: asyncio.Task
    port: int

    async def stop(self) -> None:
        """Stop accepting, let open responses finish within the grace period, then close."""
        self.server.should_exit = True
        await self.task


def tls_options(config: ServerConfig) -> dict:
    """uvicorn's TLS settings from the flags the gRPC server uses: the same certificate, and client
    certificates required (mTLS) when --tls-ca is set, unless --tls-require-client-cert false."""
    if not (config.tls_cert or config.tls_key):
        return {}
    if not (config.tls_cert and config.tls_key):
        raise ConfigError("TLS needs both --tls-cert and --tls-key")
    options = {"ssl_certfile": config.tls_cert, "ssl_keyfile": config.tls_key}
    if config.tls_ca:
        options.update(ssl_ca_certs=config.tls_ca,
                       ssl_cert_reqs=ssl.CERT_REQUIRED if config.tls_require_client_cert else ssl.CERT_OPTIONAL)
    return options


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on HOST:PORT ("[::]" takes IPv4 too, as the gRPC server does)."""
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port} for HTTP (--http-port): {exc.strerror}; "
                          "is the port already in use?") from exc
    return sock


async def start_http(app, config: ServerConfig, port: int, limits: ConnectionLimits = ConnectionLimits()) -> RunningHttp:
    """Bind, start uvicorn as a task of this loop, and return once it accepts connections."""
    sock = bind(config.host, port)
    server_config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off",
                                   http=bounded_protocol(limits), timeout_keep_alive=limits.keep_alive_s,
                                   timeout_graceful_shutdown=max(1, round(config.grace_s)), **tls_options(config))
    try:
        server_config.load()
    except (OSError, ssl.SSLError) as exc:
        sock.close()
        raise ConfigError(f"cannot set up TLS for HTTP from --tls-cert/--tls-key/--tls-ca: {exc}") from exc
    server = EmbeddedServer(server_config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
            raise ConfigError(f"the HTTP server on port {port} stopped while starting")
        await asyncio.sleep(0.01)
    return RunningHttp(server, task, sock.getsockname()[1])
