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
from gateway.verifier_pool import Verifier, VerifierPool, parse_targets
from gateway.verifier_watch import GATEWAY_ADVICE, PoolWatch
from specdec.runtime import config as specdec_config
from specdec.runtime import grpc_server
from specdec.runtime import metrics
from specdec.modeling import models
from specdec.runtime.interceptors import RequestSizeLimit
from specdec.runtime.service_main import exit_process, run_main, serve_until_signal
from specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc, gateway_pb2, gateway_pb2_grpc, verifier_pb2

log = logging.getLogger("gateway")
DEFAULTS = {"port": 50051, "metrics_port": 9101}


class PeerError(RuntimeError):
    """A peer is unreachable or incompatible at start-up; the message says which and why."""


async def first_model_info(verifiers: list[Verifier], wait_s: float) -> common_pb2.ModelInfo:
    """The ModelInfo of the first verifier to answer within wait_s; PeerError when none does."""
    calls = {asyncio.ensure_future(v.stub.GetModelInfo(verifier_pb2.GetModelInfoRequest(), timeout=wait_s,
                                                       wait_for_ready=True)): v for v in verifiers}
    errors: list[grpc.aio.AioRpcError] = []
    try:
        for done in asyncio.as_completed(calls):
            try:
                return (await done).info
            except grpc.aio.AioRpcError as exc:
                errors.append(exc)
    finally:
        for call in calls:
            call.cancel()
    refused = [exc for exc in errors if exc.code() == grpc.StatusCode.UNAUTHENTICATED]
    if refused:
        raise PeerError(f"the verifier refused the gateway: {refused[0].details()}")
    names = ", ".join(v.address for v in verifiers)
    raise PeerError(f"no verifier ({names}) answered within {wait_s:.0f} s ({errors[0].code().name}); "
                    "start one first or fix --verifier")


async def check_peers(cfg: GatewayConfig, watch: PoolWatch, server_cfg, tokenizer_info):
    """Wait for a verifier to answer (and the draft); refuse tokenizers that differ. Returns the first verifier's
    ModelInfo: the model the gateway serves, pinned for its life (gateway/verifier_watch.py), on every verifier."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + cfg.peer_wait_s
    await watch.refresh()
    while not watch.pool.members:  # a DNS name with no address yet (no verifier pod is ready)
        if loop.time() >= deadline:
            raise PeerError(f"--verifier {watch.targets} resolved to no address within {cfg.peer_wait_s:.0f} s; "
                            "start a verifier first or fix --verifier")
        await asyncio.sleep(1.0)
        await watch.refresh()
    target = await first_model_info(list(watch.pool.members.values()), max(deadline - loop.time(), 1.0))
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
    targets = parse_targets(cfg.verifier)
    pool = VerifierPool()

    async def not_serving_yet() -> None:
        """Verdicts before the front doors exist: applied all at once when they do (verifiers_changed)."""

    watch = PoolWatch(pool, targets, lambda address: grpc_server.open_channel(address, server_cfg,
                                                                                  tls_name=targets.dns_host),
                      tokenizer_info, cfg.peer_check_s, not_serving_yet)
    target = await check_peers(cfg, watch, server_cfg, tokenizer_info)
    watch.pin(target)
    await watch.check_all()  # every verifier's first verdict (the pool's members start out "not checked yet")
    log.info("the verifier serves %s (model fingerprint %s): this gateway serves that model only", target.model,
             target.model_fingerprint or "not reported")
    token_chars, token_bytes = models.longest_token(tokenizer)
    model_limits = ModelLimits(target.vocab_size, target.max_context, cfg.max_prompt_tokens, token_chars, token_bytes)
    generation = Generation(tokenizer, pool, model_limits, cfg, tokenizer_info.tokenizer_fingerprint)
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


    async def verifiers_changed() -> None:
        """The one place the gateway's health changes: both front doors report what is set here. SERVING while
        at least one verifier is usable; the limits are the tightest of the usable verifiers'."""
        problem = pool.problem()
        if (problem is None) != (generation.verifier_problem is None):
            if problem:
                log.error("no verifier is usable: health NOT_SERVING until one is")
            else:
                log.info("%d of %d verifiers usable: health SERVING", len(pool.usable()), len(pool.members))
        generation.verifier_problem = problem
        usable = pool.usable()
        metrics.USABLE_VERIFIERS.set(len(usable))
        infos = [v.info for v in usable if v.info is not None]
        if infos:  # the same tokenizer and model; a new verifier may still have another context or name
            max_context = min(info.max_context for info in infos)
            generation.limits = dataclasses.replace(generation.limits, vocab_size=infos[0].vocab_size,
                                                    max_context=max_context)
            served.max_context = max_context
            if not cfg.served_model_name and served.name != infos[0].model:
                log.info("the verifier names its model %s (was %s): serving it under that name", infos[0].model,
                         served.name)
                served.name = infos[0].model
        await running.set_serving(problem is None)

    watch.on_change = verifiers_changed
    await verifiers_changed()
    # What start-up loaded (the tokenizer, the libraries) lives as long as the process: keep it out of the
    # garbage collector's full passes, which hold the interpreter lock, and so every request and health check,
    # for as long as they take to walk it.
    gc.freeze()
    watching = asyncio.create_task(watch.run())
    try:
        await serve_until_signal(FrontDoors(running, http, generation), server_cfg,
                                 f"gateway (verifiers {targets}: {len(pool.usable())} of {len(pool.members)} "
                                 f"usable, auth {'on' if keys else 'off'})")
    finally:
        watching.cancel()
    await watch.close()


def main(argv: list[str] | None = None) -> int:
    return run_main("python -m gateway", "Gateway: the public specdec.v1.Gateway API.", GatewayConfig, DEFAULTS,
                    "specdec-gateway", serve, argv, fatal=(PeerError,))


if __name__ == "__main__":
    exit_process(main())
