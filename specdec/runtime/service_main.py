"""What every service's `python -m X` does: parse config, set up logging and tracing, serve until a signal."""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import sys
import typing

from specdec.runtime import config as specdec_config
from specdec.runtime import grpc_server
from specdec.runtime import loopback
from specdec.runtime import metrics
from specdec.modeling import models
from specdec.runtime import telemetry

log = logging.getLogger(__name__)


async def serve_until_signal(running: grpc_server.RunningServer, server_cfg: specdec_config.ServerConfig,
                             what: str) -> None:
    """Expose /metrics, log where we serve, then on SIGINT/SIGTERM: NOT_SERVING, drain, stop."""
    metrics_port = metrics.serve(server_cfg.metrics_port, server_cfg.host)
    reach = "loopback only" if loopback.is_loopback_host(server_cfg.host) else "reachable from other machines"
    log.info("%s serving on port %d at %s (%s); metrics on %s", what, running.port, server_cfg.host, reach,
             metrics_port)
    await grpc_server.wait_for_signal()
    log.info("shutting down: NOT_SERVING, draining for up to %.0f s", server_cfg.grace_s)
    await running.stop(server_cfg.grace_s)


def run_main(
    prog: str,
    description: str,
    config_type: type,
    defaults: dict,
    service_name: str,
    serve: typing.Callable[[specdec_config.ServerConfig, typing.Any], typing.Awaitable[None]],
    argv: list[str] | None = None,
    fatal: tuple[type[BaseException], ...] = (),
) -> int:
    """Parse flags/env into (ServerConfig, config_type), run `serve`; exit 2 with one line on a start-up error.
    An internal service (config_type an InternalServiceConfig) checks who could reach it before anything loads."""
    server_cfg, cfg = specdec_config.parse([specdec_config.ServerConfig, config_type], description, argv,
                                           defaults=defaults, prog=prog)
    grpc_server.setup_logging(server_cfg.log_level, server_cfg.log_format)
    if isinstance(cfg, specdec_config.ModelConfig):
        models.set_up_torch(cfg.threads)
    provider = telemetry.setup_tracing(service_name)
    try:
        if isinstance(cfg, specdec_config.InternalServiceConfig):
            grpc_server.check_internal_exposure(server_cfg, cfg.insecure)
        asyncio.run(serve(server_cfg, cfg))
    except (models.ModelLoadError, grpc_server.ConfigError, *fatal) as exc:
        logging.getLogger(prog).error("%s", exc)
        return 2
    finally:
        provider.shutdown()
    return 0


def exit_process(code: int) -> typing.NoReturn:
    """Leave after a clean stop: the exit handlers run (logging's flush, vLLM's worker clean-up), then the process
    ends without Python's module finalization, which tears down torch and gRPC object by object and is most of a
    clean stop's time, for nothing a stopped server needs."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
