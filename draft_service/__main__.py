"""python -m draft_service: serve a proposer over gRPC (specdec.v1.DraftService)."""

from __future__ import annotations

import asyncio
import logging
import sys

import torch

from draft_service.config import DraftConfig
from draft_service.model_draft import ModelProposer
from draft_service.ngram import NgramProposer
from draft_service.server import DraftServicer
from specdec import config as specdec_config
from specdec import grpc_server, metrics, models, telemetry
from specdec.v1 import draft_pb2, draft_pb2_grpc

log = logging.getLogger("draft_service")
DEFAULTS = {"port": 50053, "metrics_port": 9103}


def build_servicer(cfg: DraftConfig) -> DraftServicer:
    if not cfg.model:
        raise models.ModelLoadError("--model is required: the draft model dir, or for n-gram the target's tokenizer dir")
    tokenizer = models.load_tokenizer(cfg.model)
    if cfg.method == "model":
        log.info("loading draft model %s (%s, %s)", cfg.model, cfg.device, cfg.dtype)
        model = models.load_causal_lm(cfg.model, cfg.device, cfg.dtype)
        return DraftServicer(ModelProposer(model), models.describe(cfg.model, tokenizer, model), cfg)
    info = models.describe(cfg.model, tokenizer)
    return DraftServicer(NgramProposer(cfg.ngram_min, cfg.ngram_max), info, cfg)


async def serve(server_cfg: specdec_config.ServerConfig, cfg: DraftConfig) -> None:
    servicer = build_servicer(cfg)
    running = await grpc_server.start_server(
        server_cfg,
        lambda server: draft_pb2_grpc.add_DraftServiceServicer_to_server(servicer, server),
        [draft_pb2.DESCRIPTOR.services_by_name["DraftService"].full_name],
    )
    metrics_port = metrics.serve(server_cfg.metrics_port)
    log.info("draft service (%s) serving on port %d; metrics on %s", cfg.method, running.port, metrics_port)
    await grpc_server.wait_for_signal()
    log.info("shutting down: NOT_SERVING, draining for up to %.0f s", server_cfg.grace_s)
    await running.stop(server_cfg.grace_s)


def main(argv: list[str] | None = None) -> int:
    server_cfg, cfg = specdec_config.parse(
        [specdec_config.ServerConfig, DraftConfig], "Draft service: proposes blocks of speculative tokens.", argv,
        defaults=DEFAULTS, prog="python -m draft_service",
    )
    grpc_server.setup_logging(server_cfg.log_level)
    torch.set_grad_enabled(False)
    provider = telemetry.setup_tracing("specdec-draft")
    try:
        asyncio.run(serve(server_cfg, cfg))
    except (models.ModelLoadError, grpc_server.ConfigError) as exc:
        log.error("%s", exc)
        return 2
    finally:
        provider.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
