"""specdec.v1.Gateway: the public API.

Per request: check the input, tokenize, open one Decode stream to the
verifier (which drives the draft/verify rounds), detokenize incrementally, and
return text with usage and speculation statistics. This span is the root of
the request's trace.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid

import grpc
from opentelemetry import trace

from gateway.config import GatewayConfig
from gateway.streaming import TextAssembler
from gateway.validation import InvalidRequest, ModelLimits, check_generate_request
from specdec import limits, metrics
from specdec.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, verifier_pb2, verifier_pb2_grpc

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

# Verifier failures as the client should see them.
PASSED_THROUGH = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
                  grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, tokenizer, verifier: verifier_pb2_grpc.VerifierServiceStub, limits_: ModelLimits,
                 config: GatewayConfig):
        self.tokenizer = tokenizer
        self.verifier = verifier
        self.limits = limits_
        self.config = config

    async def Generate(self, request: gateway_pb2.GenerateRequest, context: grpc.aio.ServicerContext):
        response = gateway_pb2.GenerateResponse()
        async with contextlib.aclosing(self._generate(request, context)) as pieces:  # a cancel frees it at once
            async for piece in pieces:
                response.text += piece.text
                response.token_ids.extend(piece.token_ids)
                if piece.finish_reason:
                    response.finish_reason = piece.finish_reason
                    response.matched_stop = piece.matched_stop
                    response.usage.CopyFrom(piece.usage)
                    response.speculation.CopyFrom(piece.speculation)
        return response

    async def GenerateStream(self, request: gateway_pb2.GenerateRequest, context: grpc.aio.ServicerContext):
        async with contextlib.aclosing(self._generate(request, context)) as pieces:
            async for piece in pieces:
                yield piece

    async def _generate(self, request: gateway_pb2.GenerateRequest, context: grpc.aio.ServicerContext):
        span = trace.get_current_span()
        prompt_ids = await self._prompt_ids(request, context)
        try:
            decode_request = check_generate_request(request, prompt_ids, self.limits, self.config.default_max_tokens,
                                                    self.config.num_speculative_tokens)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        decode_request.request_id = uuid.uuid4().hex[:16]
        span.set_attributes({"specdec.request_id": decode_request.request_id, "specdec.prompt_tokens": len(prompt_ids),
                             "specdec.max_tokens": decode_request.max_tokens,
                             "specdec.temperature": request.temperature})
        if self.config.trace_prompts and request.WhichOneof("input") == "prompt":
            span.set_attribute("specdec.prompt", request.prompt)
        text = TextAssembler(self.tokenizer, prompt_ids, list(request.stop))
        started = last = time.perf_counter()
        first = True
        stream = None
        metrics.LIVE_SEQUENCES.inc()
        try:
            stream = self.verifier.Decode(decode_request, timeout=self.config.request_timeout_s)
            async for message in stream:
                now = time.perf_counter()
                if message.token_ids:
                    (metrics.TIME_TO_FIRST_TOKEN if first else metrics.INTER_TOKEN_LATENCY).observe(
                        (now - (started if first else last)) / (1 if first else len(message.token_ids)))
                    first, last = False, now
                piece = gateway_pb2.GenerateResponse(token_ids=message.token_ids, text=text.push(message.token_ids))
                if message.finish_reason:
                    piece.text += text.finish(message.matched_stop)
                    piece.finish_reason = message.finish_reason
                    piece.matched_stop = message.matched_stop
                    piece.usage.CopyFrom(message.usage)
                    piece.speculation.CopyFrom(message.speculation)
                    self._record(span, message)
                yield piece
        except grpc.aio.AioRpcError as exc:
            await self._abort_for_verifier_error(exc, context)
        finally:
            metrics.LIVE_SEQUENCES.dec()
            if stream is not None and not stream.done():
                # the client went away (cancelled, deadline): end the verifier's call now, which frees the sequence
                stream.cancel()

    async def _prompt_ids(self, request: gateway_pb2.GenerateRequest, context) -> list[int]:
        if request.WhichOneof("input") == "prompt_token_ids":
            return list(request.prompt_token_ids.ids)
        if len(request.prompt) > limits.MAX_PROMPT_CHARS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"prompt has {len(request.prompt)} characters; at most {limits.MAX_PROMPT_CHARS}")
        return self.tokenizer.encode(request.prompt, add_special_tokens=False) if request.prompt else []

    @staticmethod
    def _record(span, message: verifier_pb2.DecodeResponse) -> None:
        stats = message.speculation
        span.set_attributes({
            "specdec.completion_tokens": message.usage.completion_tokens,
            "specdec.finish_reason": common_pb2.FinishReason.Name(message.finish_reason),
            "specdec.num_drafts": stats.num_drafts, "specdec.num_draft_tokens": stats.num_draft_tokens,
            "specdec.num_accepted_tokens": stats.num_accepted_tokens,
            "specdec.acceptance_rate": stats.acceptance_rate,
        })
        # the verifier counts these per round; the gateway counts the same from each finished request's statistics
        metrics.NUM_DRAFTS.inc(stats.num_drafts)
        metrics.NUM_DRAFT_TOKENS.inc(stats.num_draft_tokens)
        metrics.NUM_ACCEPTED_TOKENS.inc(stats.num_accepted_tokens)
        for position, count in enumerate(stats.accepted_per_position):
            if count:
                metrics.ACCEPTED_PER_POS.labels(position=str(position)).inc(count)

    @staticmethod
    async def _abort_for_verifier_error(exc: grpc.aio.AioRpcError, context) -> None:
        code = exc.code()
        if code in PASSED_THROUGH:
            await context.abort(code, exc.details() or code.name)
        if code == grpc.StatusCode.UNAVAILABLE:
            await context.abort(code, "the verifier service is unavailable; retry shortly")
        log.error("verifier call failed: %s: %s", code.name, exc.details())
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"the verifier failed ({code.name}); retry shortly")
