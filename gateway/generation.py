"""One generation, whatever the front door: check, tokenize, decode through the verifier, assemble text.

The gRPC Gateway service and the OpenAI-compatible HTTP API are two thin
mappings over this module. `Generation.prepare` turns a GenerateRequest (the
public contract) into the verifier's DecodeRequest, tokenizing off the event
loop; `Generation.run` opens one Decode stream, turns the token stream into
text pieces, and records the gateway's latency metrics and span attributes.
Every failure leaves as one `GenerationError` with a gRPC status code and a
message a person can act on; each front door maps the code to its own protocol.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import typing
import uuid

import grpc
from opentelemetry import trace

from gateway.auth import tenant_of
from gateway.config import GatewayConfig
from gateway.prompt_tokens import Offload, PromptTooLong, bounded_ids
from gateway.streaming import TextAssembler
from gateway.validation import InvalidRequest, ModelLimits, check_generate_request
from specdec.runtime import metrics
from specdec.v1 import common_pb2, gateway_pb2, verifier_pb2, verifier_pb2_grpc

log = logging.getLogger(__name__)

# Verifier failures the client should see as they are; anything else becomes UNAVAILABLE.
PASSED_THROUGH = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
                  grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}


class GenerationError(Exception):
    """A request that cannot be served: the status code says which kind, the message what to do."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclasses.dataclass
class Piece:
    """New text and token ids; the last piece also carries the verifier's final message."""

    text: str
    token_ids: list[int]
    final: verifier_pb2.DecodeResponse | None = None  # finish_reason, matched_stop, usage, speculation


class Generation:
    """The gateway's one path from a GenerateRequest to text, shared by every front door."""

    def __init__(self, tokenizer, verifier: verifier_pb2_grpc.VerifierServiceStub, limits_: ModelLimits,
                 config: GatewayConfig, tokenizer_fingerprint: str = ""):
        self.tokenizer = tokenizer
        self.verifier = verifier
        self.limits = limits_
        self.config = config
        self.tokenizer_fingerprint = tokenizer_fingerprint  # sent with every Decode: the verifier checks it
        self.verifier_problem: str | None = None  # set while the verifier is unusable (gateway.verifier_watch)
        self.offload = Offload(config.prepare_workers)  # tokenizing and parsing, off the event loop, bounded

    async def prepare(self, request: gateway_pb2.GenerateRequest, api_key: str = "",
                      default_max_tokens: int | None = None) -> verifier_pb2.DecodeRequest:
        """Tokenize (off the event loop) and check; raise GenerationError(INVALID_ARGUMENT) naming the field.

        api_key: the key the caller presented; with --api-keys on, it names the request's tenant.
        default_max_tokens: max_tokens when the request leaves it unset (None: --default-max-tokens)."""
        if self.verifier_problem:
            raise GenerationError(grpc.StatusCode.UNAVAILABLE, self.verifier_problem)
        prompt_ids = await self.prompt_ids(request)
        try:
            decode = check_generate_request(
                request, prompt_ids, self.limits,
                self.config.default_max_tokens if default_max_tokens is None else default_max_tokens,
                self.config.num_speculative_tokens)
        except InvalidRequest as exc:
            raise GenerationError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        decode.request_id = uuid.uuid4().hex[:16]
        decode.tokenizer_fingerprint = self.tokenizer_fingerprint
        if self.config.api_keys:  # an authenticated key: its tenant (with auth off, every request shares one)
            decode.tenant = tenant_of(api_key)
        span = trace.get_current_span()
        span.set_attributes({"specdec.request_id": decode.request_id, "specdec.prompt_tokens": len(prompt_ids),
                             "specdec.max_tokens": decode.max_tokens, "specdec.temperature": request.temperature})
        if self.config.trace_prompts and request.WhichOneof("input") == "prompt":
            span.set_attribute("specdec.prompt", request.prompt)
        return decode

    async def prompt_ids(self, request: gateway_pb2.GenerateRequest) -> list[int]:
        """The prompt's token ids; a prompt that cannot fit is refused first, by its length alone."""
        too_long = self.limits.prompt_size_problem(request)
        if too_long:
            raise GenerationError(grpc.StatusCode.INVALID_ARGUMENT, too_long)
        if request.WhichOneof("input") == "prompt_token_ids":
            return list(request.prompt_token_ids.ids)
        if not request.prompt:
            return []
        try:
            return await self.offload.run(bounded_ids, self.encode, request.prompt, self.limits.prompt_tokens)
        except PromptTooLong as exc:
            raise GenerationError(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"prompt has more than {self.limits.prompt_tokens} tokens ({exc.counted} in its "
                                  f"first {exc.chars} of {exc.total_chars} characters); "
                                  f"{self.limits.prompt_limit_words()}") from None

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    async def run(self, decode: verifier_pb2.DecodeRequest) -> typing.AsyncIterator[Piece]:
        """Decode through the verifier; yield text as it becomes safe to send. Closing it cancels the decode."""
        span = trace.get_current_span()
        text = TextAssembler(self.tokenizer, list(decode.prompt_token_ids), list(decode.stop))
        started = last = time.perf_counter()
        first = True
        stream = None
        metrics.LIVE_SEQUENCES.inc()
        try:
            stream = self.verifier.Decode(decode, timeout=self.config.request_timeout_s)
            async for message in stream:
                now = time.perf_counter()
                if message.token_ids:
                    (metrics.TIME_TO_FIRST_TOKEN if first else metrics.INTER_TOKEN_LATENCY).observe(
                        (now - (started if first else last)) / (1 if first else len(message.token_ids)))
                    first, last = False, now
                piece = Piece(text.push(message.token_ids), list(message.token_ids))
                if message.finish_reason:
                    piece.text += text.finish(message.matched_stop)
                    piece.final = message
                    record(span, message)
                yield piece
        except grpc.aio.AioRpcError as exc:
            raise verifier_error(exc) from None
        finally:
            metrics.LIVE_SEQUENCES.dec()
            if stream is not None and not stream.done():
                # the client went away (cancelled, deadline, disconnect): end the verifier's call, freeing the sequence
                stream.cancel()


def record(span, final: verifier_pb2.DecodeResponse) -> None:
    """The request's outcome on its span. The verifier owns the spec_decode_* counters: none are counted here."""
    stats = final.speculation
    span.set_attributes({
        "specdec.completion_tokens": final.usage.completion_tokens,
        "specdec.finish_reason": common_pb2.FinishReason.Name(final.finish_reason),
        "specdec.num_drafts": stats.num_drafts, "specdec.num_draft_tokens": stats.num_draft_tokens,
        "specdec.num_accepted_tokens": stats.num_accepted_tokens,
        "specdec.acceptance_rate": stats.acceptance_rate,
    })


def verifier_error(exc: grpc.aio.AioRpcError) -> GenerationError:
    code = exc.code()
    if code in PASSED_THROUGH:
        return GenerationError(code, exc.details() or code.name)
    if code == grpc.StatusCode.UNAVAILABLE:
        return GenerationError(code, "the verifier service is unavailable; retry shortly")
    log.error("verifier call failed: %s: %s", code.name, exc.details())
    return GenerationError(grpc.StatusCode.UNAVAILABLE, f"the verifier failed ({code.name}); retry shortly")
