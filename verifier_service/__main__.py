"""python -m verifier_service: serve the target model over gRPC (specdec.v1.VerifierService)."""

from __future__ import annotations

import asyncio
import logging

from specdec.runtime import config as specdec_config
from specdec.runtime import grpc_server
from specdec.runtime import limits
from specdec.modeling import models
from specdec.runtime.interceptors import RequestSizeLimit
from specdec.modeling.prepacked_linear import prepack_linears
from specdec.runtime.service_main import exit_process, run_main, serve_until_signal
from specdec.v1 import verifier_pb2, verifier_pb2_grpc
from verifier_service.config import VerifierConfig
from verifier_service.engines.decode_loop import Engine
from verifier_service.draft.client import DraftIncompatible, DraftLink
from verifier_service.draft.tier import DraftTier, parse_drafts
from verifier_service.forward_calibration import calibrate_forward
from verifier_service.engines.transformers_engine import TransformersEngine
from verifier_service.server import VerifierServicer

log = logging.getLogger("verifier_service")
# An internal service listens on loopback unless --host says otherwise (closed by default; see --insecure).
DEFAULTS = {"host": "127.0.0.1", "port": 50052, "metrics_port": 9102}


def build_engine(cfg: VerifierConfig, info) -> tuple[Engine, int]:
    """(engine, its parameter count; 0 where the engine keeps the weights to itself)."""
    if cfg.engine == "vllm":
        from verifier_service.engines.vllm_engine import VllmEngine

        log.info("starting the vLLM engine on %s (%s)", cfg.model, cfg.dtype)
        return VllmEngine(cfg, bool(cfg.draft), list(info.eos_token_ids), asyncio.get_running_loop()), 0
    log.info("loading target model %s (%s, %s)", cfg.model, cfg.device, cfg.dtype)
    model = models.load_causal_lm(cfg.model, cfg.device, cfg.dtype)
    num_parameters = sum(p.numel() for p in model.parameters())  # before prepacking moves weights out of them
    if cfg.prepack_weights:
        prepack_linears(model)
    return TransformersEngine(model, cfg.device, cfg.prefill_chunk_tokens, cfg.max_prefill_tokens), num_parameters


async def serve(server_cfg: specdec_config.ServerConfig, cfg: VerifierConfig) -> None:
    if not cfg.model:
        raise models.ModelLoadError("--model is required (run `make model` for the default SmolLM2-135M-Instruct)")
    tokenizer = models.load_tokenizer(cfg.model)
    # from the config alone: the draft link needs it before the engine (which may be vLLM's) starts
    info = models.describe(cfg.model, tokenizer, models.load_config_only(cfg.model))
    draft = None
    if cfg.draft:
        draft = DraftTier(parse_drafts(cfg.draft),
                          lambda address: DraftLink(address, server_cfg, info, cfg.draft_timeout_ms / 1000,
                                                    cfg.draft_ahead),
                          cfg.draft_routing, cfg.draft_check_s)
    # the weight files are read once more, for the model's identity, while the engine loads (either engine)
    fingerprint = asyncio.get_running_loop().run_in_executor(None, models.model_fingerprint, cfg.model)
    engine, info.num_parameters = build_engine(cfg, info)
    info.model_fingerprint = await fingerprint
    info.max_context = engine.max_context
    if draft is not None:
        answered = await draft.start(wait_s=cfg.draft_wait_s)
        for link in answered:
            log.info("draft at %s (%s) shares the target's tokenizer", link.address, link.method)
            if 0 < link.max_k < cfg.max_speculative_tokens:
                log.warning("the draft at %s serves blocks of at most %d tokens (its --max-speculative-tokens): k is "
                            "capped there, below this verifier's --max-speculative-tokens %d", link.address,
                            link.max_k, cfg.max_speculative_tokens)
        if not answered:
            log.warning("no draft reachable yet (--draft %s); decoding without it until one is", cfg.draft)
        if len(draft.members) > 1 or draft.targets.dns:
            log.info("draft tier: %d replicas (--draft %s), %s routing", len(draft.members), draft.targets,
                     cfg.draft_routing)
    servicer = VerifierServicer(engine, tokenizer, info, cfg, draft)
    if cfg.calibrate_forward:
        await calibrate_forward(engine, servicer.round_cost, cfg.max_speculative_tokens)
    running = await grpc_server.start_server(
        server_cfg,
        lambda server: verifier_pb2_grpc.add_VerifierServiceServicer_to_server(servicer, server),
        [verifier_pb2.DESCRIPTOR.services_by_name["VerifierService"].full_name],
        request_size=RequestSizeLimit(info.max_context * limits.TOKEN_ID_BYTES + limits.REQUEST_OVERHEAD_BYTES,
                                      f"the model's context is {info.max_context} tokens;"),
    )
    await serve_until_signal(running, server_cfg, f"verifier ({cfg.model})")


def main(argv: list[str] | None = None) -> int:
    return run_main("python -m verifier_service", "Verifier service: the target model and the rounds.",
                    VerifierConfig, DEFAULTS, "specdec-verifier", serve, argv, fatal=(DraftIncompatible,))


if __name__ == "__main__":
    exit_process(main())
