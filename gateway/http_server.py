"""Serve an ASGI app with uvicorn in the running event loop, beside the gRPC server, with its TLS flags.

The process keeps its own signal handling (specdec.service_main): uvicorn's is
turned off and the server is stopped through `RunningHttp.stop`, which lets
in-flight responses finish for up to the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import ssl

import uvicorn

from specdec.config import ServerConfig
from specdec.grpc_server import ConfigError


class EmbeddedServer(uvicorn.Server):
    """uvicorn that leaves SIGINT/SIGTERM to the process (it would otherwise replace the loop's handlers)."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


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


async def start_http(app, config: ServerConfig, port: int) -> RunningHttp:
    """Bind, start uvicorn as a task of this loop, and return once it accepts connections."""
    sock = bind(config.host, port)
    server_config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off",
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
