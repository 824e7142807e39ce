"""Both front doors in this process over a fake VerifierService, for tests of what the gateway itself does.

The fake answers Decode with a few fixed token ids after `prefill_s` seconds (a slow prefill) and records
every call it got and when each was cancelled, so a test can tell whether, and how soon, the gateway ended the
verifier's call. The gateway side is the real one: Generation, the OpenAI app on uvicorn, GatewayServicer.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from gateway.config import GatewayConfig
from gateway.generation import Generation
from gateway.http_server import start_http
from gateway.openai_api import ServedModel, create_app
from gateway.server import GatewayServicer
from gateway.validation import ModelLimits
from gateway.verifier_pool import VerifierPool
from specdec.runtime import grpc_server
from specdec.runtime.config import ServerConfig
from specdec.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, verifier_pb2, verifier_pb2_grpc

MODEL = "tiny"
CONTEXT = 64
KEY = "sk-fake-verifier"
# SmolLM2's template is ChatML; the tiny test tokenizer has none. It renders `name` when a message has one.
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] }}{% if m['name'] %}{{ ' ' + m['name'] }}{% endif %}"
          "{{ '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


class FakeVerifier(verifier_pb2_grpc.VerifierServiceServicer):
    """Decode: wait `prefill_s`, then send `reply_ids` one per message and finish with FINISH_REASON_LENGTH;
    or, with `refuse` set, end the call at once with that status, as a verifier at capacity does."""

    def __init__(self, reply_ids=(40, 41, 42), prefill_s: float = 0.0,
                 refuse: tuple[grpc.StatusCode, str] | None = None):
        self.reply_ids, self.prefill_s, self.refuse = list(reply_ids), prefill_s, refuse
        self.requests: list[verifier_pb2.DecodeRequest] = []
        self.started: list[float] = []  # time.monotonic() of each call's start
        self.cancelled: list[float] = []  # and of each cancellation the fake saw

    async def Decode(self, request, context):
        self.requests.append(request)
        self.started.append(time.monotonic())
        if self.refuse:
            await context.abort(*self.refuse)
        try:
            await asyncio.sleep(self.prefill_s)
            for token in self.reply_ids:
                yield verifier_pb2.DecodeResponse(token_ids=[token])
            yield verifier_pb2.DecodeResponse(
                finish_reason=common_pb2.FINISH_REASON_LENGTH,
                usage=common_pb2.Usage(prompt_tokens=len(request.prompt_token_ids),
                                       completion_tokens=len(self.reply_ids)))
        except asyncio.CancelledError:
            self.cancelled.append(time.monotonic())
            raise


@dataclasses.dataclass
class Gateway:
    verifier: FakeVerifier
    http_port: int
    grpc_address: str

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


@contextlib.asynccontextmanager
async def running_gateway(tokenizer, verifier: FakeVerifier, api_keys=(KEY,), context: int = CONTEXT,
                          **config):
    """The fake verifier on a free port, and the gateway's HTTP and gRPC doors (the gRPC one with the server's
    own interceptors, but without the API-key one)."""
    verifier_server = grpc.aio.server()
    verifier_pb2_grpc.add_VerifierServiceServicer_to_server(verifier, verifier_server)
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), verifier_server)
    verifier_port = verifier_server.add_insecure_port("127.0.0.1:0")
    await verifier_server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{verifier_port}")
    generation = Generation(tokenizer, VerifierPool.of_channel(f"127.0.0.1:{verifier_port}", channel),
                            ModelLimits(len(tokenizer), context), GatewayConfig(api_keys=",".join(api_keys), **config))
    app = create_app(generation, ServedModel(MODEL, context), list(api_keys))
    server_config = ServerConfig(host="127.0.0.1", grace_s=1)
    http = await start_http(app, server_config, 0)
    gateway_server = await grpc_server.start_server(
        server_config, lambda server: gateway_pb2_grpc.add_GatewayServicer_to_server(GatewayServicer(generation), server),
        [gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name])
    try:
        yield Gateway(verifier, http.port, f"127.0.0.1:{gateway_server.port}")
    finally:
        await gateway_server.stop(0)
        await asyncio.wait_for(http.stop(), 10)
        await channel.close()
        await verifier_server.stop(0)


@contextlib.contextmanager
def gateway_in_thread(tokenizer, verifier: FakeVerifier, **options):
    """`running_gateway` on an event loop in a thread of its own, for blocking clients (urllib, openai, grpc)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="gateway", daemon=True)
    thread.start()
    manager = running_gateway(tokenizer, verifier, **options)
    try:
        gateway = asyncio.run_coroutine_threadsafe(manager.__aenter__(), loop).result(30)
        try:
            yield gateway
        finally:
            asyncio.run_coroutine_threadsafe(manager.__aexit__(None, None, None), loop).result(30)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
