"""One generation, whatever the front door: check, tokenize, decode through the verifier, assemble text.

The gRPC Gateway service and the OpenAI-compatible HTTP API are two thin
mappings over this module. `Generation.prepare` turns a GenerateRequest (the
public contract) into the verifier's DecodeRequest, tokenizing off the event
loop; `Generation.run` opens one Decode stream on a verifier of the pool
(gateway.verifier_pool), turns the token stream into text pieces, and records
the gateway's latency metrics and span attributes. Every failure leaves as one
`GenerationError` with a gRPC status code and a message a person can act on;
each front door maps the code to its own protocol.

Resume. A verifier that goes away mid-stream (killed, its node lost, drained
past its grace) takes the request's KV cache with it, not the request: the
gateway has every token it emitted. The request continues on another verifier
as a new Decode whose prompt is the prompt plus those tokens (ids, never
re-tokenized text), with the same sampling parameters, stop strings and
tenant, and max_tokens less what was emitted. The client's stream goes on
where it was: no token lost or repeated. Greedy output is the uninterrupted
run's. A seeded sampled request draws each token with noise keyed by (seed,
absolute position) on the transformers engine, so its output is the
uninterrupted one's too; on the vLLM engine the draws follow the draft blocks,
so after a resume the output is another sample of the same distribution, not
the same draws. Only failures that mean the verifier went away resume
(`went_away`): never a refusal (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, ...).
A constrained request (Constraint) resumes only before its first token: the
grammar's state lives in the lost verifier. Stop strings hold for the whole
output: after a resume the gateway checks them over all of it (a match may
span both verifiers' tokens). At most --max-resumes per request; each counts
in specdec_gateway_resumes and is a `specdec.resume` event on the request's
span. After a resume, usage counts the whole request; the speculation
statistics are those of the verifier that finished it (the lost one's went
with it).
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
from gateway.verifier_pool import Verifier, VerifierPool
from specdec.decoding.stopping import STOP, StopChecker
from specdec.runtime import metrics
from specdec.v1 import common_pb2, gateway_pb2, verifier_pb2

log = logging.getLogger(__name__)

# Verifier failures the client should see as they are; anything else becomes UNAVAILABLE.
PASSED_THROUGH = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
                  grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
# What a broken connection or stream reads as when gRPC reports it as INTERNAL or UNKNOWN (lower case).
DROPPED_STREAM = ("rst_stream", "stream removed", "socket closed", "connection reset", "goaway", "broken pipe",
                  "end of stream", "connection aborted")


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

    def __init__(self, tokenizer, verifiers: VerifierPool | None, limits_: ModelLimits,
                 config: GatewayConfig, tokenizer_fingerprint: str = ""):
        self.tokenizer = tokenizer
        self.verifiers = verifiers
        self.limits = limits_
        self.config = config
        self.tokenizer_fingerprint = tokenizer_fingerprint  # sent with every Decode: the verifier checks it
        self.verifier_problem: str | None = None  # set while no verifier is usable (gateway.verifier_watch)
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
        """Decode through a verifier, resuming on another if it goes away; yield text as it becomes safe to send.
        Closing it cancels the decode."""
        span = trace.get_current_span()
        prompt = list(decode.prompt_token_ids)
        text = TextAssembler(self.tokenizer, prompt, list(decode.stop))
        emitted: list[int] = []
        whole_stop: StopChecker | None = None  # after a resume: stop strings over the whole output
        lost: list[Verifier] = []  # the verifiers this request lost, in order
        failed_at: float | None = None
        started = last = time.perf_counter()
        first = True
        metrics.LIVE_SEQUENCES.inc()
        try:
            while True:
                if emitted and len(emitted) >= decode.max_tokens:  # all there; only the last message was lost
                    final = verifier_pb2.DecodeResponse(finish_reason=common_pb2.FINISH_REASON_LENGTH)
                    final = whole_request_final(final, len(prompt), len(emitted))
                    record(span, final)
                    yield Piece(text.finish(""), [], final)
                    return
                verifier = self.verifiers.pick(avoid=lost)
                if verifier is None:
                    raise GenerationError(grpc.StatusCode.UNAVAILABLE, self.verifiers.problem()
                                          or "no verifier is usable; retry shortly")
                request = resumed(decode, emitted) if emitted else decode
                remaining_s = self.config.request_timeout_s - (time.perf_counter() - started)
                stream = None
                finished = False
                try:
                    with self.verifiers.lease(verifier) as stub:
                        stream = stub.Decode(request, timeout=max(remaining_s, 0.001))
                        async for message in stream:
                            if finished:
                                continue
                            now = time.perf_counter()
                            tokens = list(message.token_ids)
                            final = message if message.finish_reason else None
                            if whole_stop is not None and tokens:
                                checked = whole_stop.check(tokens)
                                if checked.finish_reason == STOP:
                                    tokens, final = checked.kept, stopped_here(checked.matched_stop, final)
                            if tokens:
                                (metrics.TIME_TO_FIRST_TOKEN if first else metrics.INTER_TOKEN_LATENCY).observe(
                                    (now - (started if first else last)) / (1 if first else len(tokens)))
                                first, last = False, now
                                if failed_at is not None:
                                    metrics.RESUME_DELAY.observe(now - failed_at)
                                    log.info("request %s: resumed on %s, first token %.0f ms after the failure",
                                             decode.request_id, verifier.address, 1000 * (now - failed_at))
                                    failed_at = None
                            emitted += tokens
                            piece = Piece(text.push(tokens), tokens)
                            if final is not None:
                                ours = final is not message  # the gateway ended it: a stop string across a resume
                                if lost:
                                    final = whole_request_final(final, len(prompt), len(emitted))
                                piece.text += text.finish(final.matched_stop)
                                piece.final = final
                                record(span, final)
                                finished = True
                                yield piece
                                if ours:
                                    break  # and the call is cancelled below
                                continue  # the call's status follows
                            yield piece
                    if finished:
                        return
                    failure = grpc.StatusCode.UNAVAILABLE, "the verifier ended the stream without finishing it"
                except grpc.aio.AioRpcError as exc:
                    if finished:  # the request was whole already
                        return
                    if not went_away(exc):
                        raise verifier_error(exc) from None
                    failure = exc.code(), exc.details() or exc.code().name
                finally:
                    if stream is not None and not stream.done():
                        # the client went away (cancelled, deadline, disconnect), or the stop strings ended the
                        # request here: end the verifier's call, freeing the sequence
                        stream.cancel()
                code, details = failure
                if verifier.suspect is not None:  # out of the pool at once, checked again at once
                    await verifier.suspect(f"{code.name}: {details}")
                lost.append(verifier)
                why_not = self._why_not_resume(decode, emitted, lost, code)
                if why_not:
                    log.error("request %s: the verifier at %s failed after %d tokens (%s: %s); %s",
                              decode.request_id, verifier.address, len(emitted), code.name, details, why_not)
                    raise GenerationError(grpc.StatusCode.UNAVAILABLE, why_not)
                failed_at = time.perf_counter()
                if decode.stop and whole_stop is None:
                    whole_stop = StopChecker([], 2**32, list(decode.stop), self.tokenizer, prompt)
                    whole_stop.check(emitted)  # catches up; no match: the lost verifier would have stopped
                metrics.RESUMES.labels(code=code.name).inc()
                span.add_event("specdec.resume", {"specdec.verifier": verifier.address, "specdec.code": code.name,
                                                  "specdec.details": details[:200],
                                                  "specdec.tokens_emitted": len(emitted), "specdec.resume": len(lost)})
                log.warning("request %s: the verifier at %s went away after %d tokens (%s: %s); resuming on "
                            "another", decode.request_id, verifier.address, len(emitted), code.name, details)
        finally:
            metrics.LIVE_SEQUENCES.dec()

    def _why_not_resume(self, decode: verifier_pb2.DecodeRequest, emitted: list[int], lost: list[Verifier],
                        code: grpc.StatusCode) -> str | None:
        """Why the request cannot go on on another verifier after losing lost[-1] (the client's message), or
        None when it can."""
        if emitted and decode.HasField("constraint"):
            return (f"the verifier failed mid-request ({code.name}); a constrained request cannot resume past its "
                    "first token (the grammar's state was on that verifier); retry shortly")
        if len(lost) > self.config.max_resumes:
            return f"the verifier failed mid-request ({code.name}) after {len(lost) - 1} resumes; retry shortly"
        if self.verifiers.pick(avoid=lost) is None:
            return (f"the verifier service is unavailable ({code.name}) and no other verifier is usable; "
                    "retry shortly")
        return None


def resumed(decode: verifier_pb2.DecodeRequest, emitted: list[int]) -> verifier_pb2.DecodeRequest:
    """The request again, continuing after `emitted`: those tokens join the prompt, max_tokens shrinks by them;
    sampling, stop strings, k, tenant and fingerprint stay."""
    request = verifier_pb2.DecodeRequest()
    request.CopyFrom(decode)
    request.prompt_token_ids.extend(emitted)
    request.max_tokens = decode.max_tokens - len(emitted)
    return request


def stopped_here(matched_stop: str, final: verifier_pb2.DecodeResponse | None) -> verifier_pb2.DecodeResponse:
    """The last message of a request the gateway ended on a stop string spanning a resume."""
    message = verifier_pb2.DecodeResponse(finish_reason=common_pb2.FINISH_REASON_STOP, matched_stop=matched_stop)
    if final is not None:
        message.speculation.CopyFrom(final.speculation)
    return message


def whole_request_final(final: verifier_pb2.DecodeResponse, prompt_tokens: int, completion_tokens: int
                        ) -> verifier_pb2.DecodeResponse:
    """A resumed request's last message, with usage for the whole request (the verifier counted its part)."""
    message = verifier_pb2.DecodeResponse()
    message.CopyFrom(final)
    message.usage.CopyFrom(common_pb2.Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens))
    return message


def went_away(exc: grpc.aio.AioRpcError) -> bool:
    """Whether a failed Decode means its verifier went away (resume elsewhere), not that it refused the request.
    The verifier never ends a call with UNAVAILABLE or CANCELLED itself: those are a connection that failed or
    a server that stopped. INTERNAL and UNKNOWN count only when they describe a dropped stream."""
    code = exc.code()
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return True
    details = (exc.details() or "").lower()
    return code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN) and any(s in details for s in DROPPED_STREAM)


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
