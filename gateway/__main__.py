"""python -m gateway: serve the public API: specdec.v1.Gateway over gRPC, and the OpenAI-compatible HTTP API."""

from __future__ import annotations

import asyncio
import logging
import sys

from grpc_health.v1 import health_pb2_grpc

from gateway.auth import ApiKeyInterceptor, parse_keys
from gateway.config import GatewayConfig
from gateway.generation import Generation
from gateway.http_server import RunningHttp, start_http
from gateway.openai_api import ServedModel, create_app
from gateway.server import GatewayServicer
from gateway.validation import ModelLimits
from specdec import config as specdec_config
from specdec import grpc_server, models
from specdec.service_main import run_main, serve_until_signal
from specdec.v1 import draft_pb2, draft_pb2_grpc, gateway_pb2, gateway_pb2_grpc, verifier_pb2, verifier_pb2_grpc

log = logging.getLogger("gateway")
DEFAULTS = {"port": 50051, "metrics_port": 9101}


class PeerError(RuntimeError):
    """A peer is unreachable or incompatible at start-up; the message says which and why."""


async def check_peers(cfg: GatewayConfig, channel, server_cfg, tokenizer_info):
    """Ask the verifier (and the draft) who they are; refuse tokenizers that differ."""
    import grpc

    stub = verifier_pb2_grpc.VerifierServiceStub(channel)
    try:
        reply = await stub.GetModelInfo(verifier_pb2.GetModelInfoRequest(), timeout=cfg.peer_wait_s,
                                        wait_for_ready=True)
    except grpc.aio.AioRpcError as exc:
        raise PeerError(f"the verifier at {cfg.verifier} did not answer within {cfg.peer_wait_s:.0f} s "
                        f"({exc.code().name}); start it first or fix --verifier") from exc
    target = reply.info
    problem = models.tokenizer_mismatch(target, tokenizer_info, role="the gateway's --model",
                                        target_role="the verifier")
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


class FrontDoors:
    """The gRPC server and the HTTP API as one running server: stopping it drains both at once."""

    def __init__(self, running: grpc_server.RunningServer, http: RunningHttp | None):
        self.running, self.http, self.port = running, http, running.port

    async def stop(self, grace_s: float) -> None:
        await asyncio.gather(self.running.stop(grace_s), *([self.http.stop()] if self.http else []))


async def serve(server_cfg: specdec_config.ServerConfig, cfg: GatewayConfig) -> None:
    if not cfg.model:
        raise models.ModelLoadError("--model is required: the target model's directory (for its tokenizer)")
    tokenizer = models.load_tokenizer(cfg.model)
    channel = grpc_server.open_channel(cfg.verifier, server_cfg)
    target = await check_peers(cfg, channel, server_cfg, models.describe(cfg.model, tokenizer))
    max_context = target.max_context if not cfg.max_prompt_tokens else min(target.max_context, cfg.max_prompt_tokens)
    generation = Generation(tokenizer, verifier_pb2_grpc.VerifierServiceStub(channel),
                            ModelLimits(target.vocab_size, max_context), cfg)
    keys = parse_keys(cfg.api_keys)
    http = None
    if cfg.http_port >= 0:
        app = create_app(generation, ServedModel(cfg.served_model_name or cfg.model, max_context), keys,
                         health_pb2_grpc.HealthStub(channel))
        http = await start_http(app, server_cfg, cfg.http_port)
        log.info("OpenAI-compatible HTTP API on port %d (%s)", http.port,
                 "https" if server_cfg.tls_cert else "http")
    running = await grpc_server.start_server(
        server_cfg,
        lambda server: gateway_pb2_grpc.add_GatewayServicer_to_server(GatewayServicer(generation), server),
        [gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name],
        interceptors=[ApiKeyInterceptor(keys)] if keys else [],
    )
    await serve_until_signal(FrontDoors(running, http), server_cfg,
                             f"gateway (verifier {cfg.verifier}, auth {'on' if keys else 'off'})")
    await channel.close()


def main(argv: list[str] | None = None) -> int:
    return run_main("python -m gateway", "Gateway: the public specdec.v1.Gateway API.", GatewayConfig, DEFAULTS,
                    "specdec-gateway", serve, argv, fatal=(PeerError,))


if __name__ == "__main__":
    sys.exit(main())
