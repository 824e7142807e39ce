"""python -m gateway: serve the public API: specdec.v1.Gateway over gRPC, and the OpenAI-compatible HTTP API."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging

import grpc

from gateway.auth import ApiKeyInterceptor, parse_keys
from gateway.config import GatewayConfig
from gateway.generation import Generation
from gateway.http_server import ConnectionLimits, RunningHttp, start_http
from gateway.openai_api import ServedModel, create_app
from gateway.server import GatewayServicer
from gateway.validation import ModelLimits
from gateway.verifier_watch import GATEWAY_ADVICE, VerifierWatch
from specdec.runtime import config as specdec_config
from specdec.runtime import grpc_server
from specdec.modeling import models
from specdec.runtime.interceptors import RequestSizeLimit
from specdec.runtime.service_main import exit_process, run_main, serve_until_signal
from specdec.v1 import draft_pb2, draft_pb2_grpc, gateway_pb2, gateway_pb2_grpc, verifier_pb2, verifier_pb2_grpc

log = logging.getLogger("gateway")
DEFAULTS = {"port": 50051, "metrics_port": 9101}


class PeerError(RuntimeError):
    """A peer is unreachable or incompatible at start-up; the message says which and why."""


async def check_peers(cfg: GatewayConfig, channel, server_cfg, tokenizer_info):
    """Ask the verifier (and the draft) who they are; refuse tokenizers that differ. Returns the verifier's ModelInfo:
    the model the gateway serves, pinned for its life (gateway/verifier_watch.py)."""
    stub = verifier_pb2_grpc.VerifierServiceStub(channel)
    try:
        reply = await stub.GetModelInfo(verifier_pb2.GetModelInfoRequest(), timeout=cfg.peer_wait_s,
                                        wait_for_ready=True)
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
            raise PeerError(f"the verifier at {cfg.verifier} refused the gateway: {exc.details()}") from exc
        raise PeerError(f"the verifier at {cfg.verifier} did not answer within {cfg.peer_wait_s:.0f} s "
                        f"({exc.code().name}); start it first or fix --verifier") from exc
    target = reply.info
    problem = models.tokenizer_mismatch(target, tokenizer_info, role="the gateway's --model",
                                        target_role="the verifier", advice=GATEWAY_ADVICE)
    if problem:
        raise PeerError(problem)
    if cfg.draft:
        draft_channel = grpc_server.open_channel(cfg.draft, server_cfg)
        try:
            draft = await draft_pb2_grpc.DraftServiceStub(draft_channel).GetDraftInfo(
                draft_pb2.GetDraftInfoRequest(), timeout=cfg.peer_wait_s, wait_for_ready=True)
        except grpc.aio.AioRpcError as exc:
            log.warning("the draft at %s did not answer (%s); the verifier decodes without it until it does",
                        cfg.draft, exc.code().name)
        else:
            problem = models.tokenizer_mismatch(target, draft.info)
            if problem:
                raise PeerError(problem)
            log.info("draft at %s (%s) shares the target's tokenizer", cfg.draft, draft.method)
        finally:
            await draft_channel.close()
    return target


def request_size_limit(model_limits: ModelLimits) -> RequestSizeLimit:
    return RequestSizeLimit(model_limits.request_bytes,
                            f"{model_limits.prompt_limit_words()} and this model's longest token is "
                            f"{model_limits.max_token_bytes} bytes:")


class FrontDoors:
    """The gRPC server and the HTTP API as one running server: stopping it drains both at once."""

    def __init__(self, running: grpc_server.RunningServer, http: RunningHttp | None, generation: Generation):
        self.running, self.http, self.port, self.generation = running, http, running.port, generation

    async def stop(self, grace_s: float) -> None:
        self.generation.verifier_problem = "the gateway is shutting down; retry on another replica"  # HTTP /health
        await asyncio.gather(self.running.stop(grace_s), *([self.http.stop()] if self.http else []))


async def serve(server_cfg: specdec_config.ServerConfig, cfg: GatewayConfig) -> None:
    if not cfg.model:
        raise models.ModelLoadError("--model is required: the target model's directory (for its tokenizer)")
    tokenizer = models.load_tokenizer(cfg.model)
    tokenizer_info = models.describe(cfg.model, tokenizer)
    channel = grpc_server.open_channel(cfg.verifier, server_cfg)
    target = await check_peers(cfg, channel, server_cfg, tokenizer_info)
    log.info("the verifier serves %s (model fingerprint %s): this gateway serves that model only", target.model,
             target.model_fingerprint or "not reported")
    token_chars, token_bytes = models.longest_token(tokenizer)
    model_limits = ModelLimits(target.vocab_size, target.max_context, cfg.max_prompt_tokens, token_chars, token_bytes)
    generation = Generation(tokenizer, verifier_pb2_grpc.VerifierServiceStub(channel), model_limits, cfg,
                            tokenizer_info.tokenizer_fingerprint)
    keys = parse_keys(cfg.api_keys)
    served = ServedModel(cfg.served_model_name or target.model, target.max_context)  # the verifier's model
    http = None
    if cfg.http_port >= 0:
        app = create_app(generation, served, keys)
        http = await start_http(app, server_cfg, cfg.http_port,
                                ConnectionLimits(cfg.http_header_timeout_s, cfg.http_keep_alive_s,
                                                 cfg.http_max_connections))
        log.info("OpenAI-compatible HTTP API on port %d (%s)", http.port,
                 "https" if server_cfg.tls_cert else "http")
    running = await grpc_server.start_server(
        server_cfg,
        lambda server: gateway_pb2_grpc.add_GatewayServicer_to_server(GatewayServicer(generation), server),
        [gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name],
        interceptors=[ApiKeyInterceptor(keys)] if keys else [],
        request_size=request_size_limit(model_limits),
    )


    async def verifier_changed(problem: str | None, info) -> None:
        """The one place the gateway's health changes: both front doors report what is set here."""
        generation.verifier_problem = problem
        if info is not None:  # the same tokenizer and model; a new verifier may still have another context or name
            generation.limits = dataclasses.replace(generation.limits, vocab_size=info.vocab_size,
                                                    max_context=info.max_context)
            served.max_context = info.max_context
            if not cfg.served_model_name and served.name != info.model:
                log.info("the verifier names its model %s (was %s): serving it under that name", info.model,
                         served.name)
                served.name = info.model
        await running.set_serving(problem is None)

    # What start-up loaded (the tokenizer, the libraries) lives as long as the process: keep it out of the
    # garbage collector's full passes, which hold the interpreter lock, and so every request and health check,
    # for as long as they take to walk it.
    gc.freeze()
    watch = asyncio.create_task(
        VerifierWatch(channel, cfg.verifier, tokenizer_info, cfg.peer_check_s, verifier_changed, model=target).run())
    try:
        await serve_until_signal(FrontDoors(running, http, generation), server_cfg,
                                 f"gateway (verifier {cfg.verifier}, auth {'on' if keys else 'off'})")
    finally:
        watch.cancel()
    await channel.close()


def main(argv: list[str] | None = None) -> int:
    return run_main("python -m gateway", "Gateway: the public specdec.v1.Gateway API.", GatewayConfig, DEFAULTS,
                    "specdec-gateway", serve, argv, fatal=(PeerError,))


if __name__ == "__main__":
    exit_process(main())
