"""python -m draft_service: serve a proposer over gRPC (specdec.v1.DraftService)."""

from __future__ import annotations

import dataclasses
import logging

from draft_service.config import MODEL_METHODS, DraftConfig
from draft_service.grammar_draft import GrammarProposer
from draft_service.hybrid import HybridProposer
from draft_service.model_draft import ModelProposer
from draft_service.ngram import NgramProposer
from draft_service.replay import ReplayProposer
from draft_service.server import DraftServicer
from draft_service.suffix import SuffixConfig, SuffixProposer
from specdec.runtime import config as specdec_config
from specdec.runtime import grpc_server
from specdec.modeling import models
from specdec.runtime.service_main import exit_process, run_main, serve_until_signal
from specdec.v1 import draft_pb2, draft_pb2_grpc

log = logging.getLogger("draft_service")
# An internal service listens on loopback unless --host says otherwise (closed by default; see --insecure).
DEFAULTS = {"host": "127.0.0.1", "port": 50053, "metrics_port": 9103}


def build_servicer(cfg: DraftConfig) -> DraftServicer:
    servicer = build_proposer_servicer(cfg)
    if cfg.grammar_draft == "on" or cfg.method == "grammar":  # constrained requests draft with their grammar
        tokenizer = models.load_tokenizer(cfg.model)
        inner = None if cfg.method == "grammar" else servicer.proposer
        servicer.proposer = GrammarProposer(inner, tokenizer, servicer.info.vocab_size,
                                            list(servicer.info.eos_token_ids), cfg.grammar_compile_timeout_s)
    return servicer


def build_proposer_servicer(cfg: DraftConfig) -> DraftServicer:
    if not cfg.model:
        raise models.ModelLoadError("--model is required: the draft model dir, or for n-gram the target's tokenizer dir")
    tokenizer = models.load_tokenizer(cfg.model)
    if cfg.method in MODEL_METHODS:
        log.info("loading draft model %s (%s, %s)", cfg.model, cfg.device, cfg.dtype)
        model = models.load_causal_lm(cfg.model, cfg.device, cfg.dtype)
        proposer = ModelProposer(model)
        if cfg.method == "hybrid":
            proposer = HybridProposer(SuffixProposer(suffix_config(cfg)), proposer, cfg.hybrid_min_suffix,
                                      cfg.max_speculative_tokens)
        return DraftServicer(proposer, models.describe(cfg.model, tokenizer, model), cfg)
    info = models.describe(cfg.model, tokenizer)
    if cfg.method == "replay":
        try:
            proposer = ReplayProposer.from_file(cfg.replay_file, cfg.replay_acceptance, cfg.replay_seed, info.vocab_size)
        except (OSError, ValueError) as exc:
            raise models.ModelLoadError(f"--replay-file: cannot read the recorded continuations: {exc}") from exc
        log.info("replay draft (benchmarks only): %d recorded continuations, alpha %g, independent per token",
                 len(proposer.continuations), cfg.replay_acceptance)
        return DraftServicer(proposer, info, cfg)
    if cfg.method == "suffix":
        return DraftServicer(SuffixProposer(suffix_config(cfg)), info, cfg)
    return DraftServicer(NgramProposer(cfg.ngram_min, cfg.ngram_max), info, cfg)


def suffix_config(cfg: DraftConfig) -> SuffixConfig:
    return SuffixConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(SuffixConfig)})


async def serve(server_cfg: specdec_config.ServerConfig, cfg: DraftConfig) -> None:
    servicer = build_servicer(cfg)
    running = await grpc_server.start_server(
        server_cfg,
        lambda server: draft_pb2_grpc.add_DraftServiceServicer_to_server(servicer, server),
        [draft_pb2.DESCRIPTOR.services_by_name["DraftService"].full_name],
    )
    await serve_until_signal(running, server_cfg, f"draft service ({cfg.method})")


def main(argv: list[str] | None = None) -> int:
    return run_main("python -m draft_service", "Draft service: proposes blocks of speculative tokens.", DraftConfig,
                    DEFAULTS, "specdec-draft", serve, argv)


if __name__ == "__main__":
    exit_process(main())
