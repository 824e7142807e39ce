"""VerifierService: Decode streams a sequence's tokens round by round; the sequence lives as long as the call."""

from __future__ import annotations

import asyncio
import functools
import logging

import grpc
from opentelemetry import trace

from specdec.runtime import metrics
from specdec.decoding.grammar import GrammarBusy, GrammarCompiler, GrammarError, SequenceGrammar, constraint_set
from specdec.decoding.sampling import SamplingParams
from specdec.decoding.stopping import LENGTH, STOP, StopChecker
from specdec.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
from verifier_service.config import VerifierConfig
from verifier_service.engines.decode_loop import DecodeSpec, Engine, decode
from verifier_service.draft.client import Constrained, DraftLink
from verifier_service.draft.tier import DraftTier
from verifier_service.sequences import CapacityExceeded, SequenceRegistry
from verifier_service.speculation.request import RequestSpeculation
from verifier_service.speculation.policy import RoundCost, SpeculationPolicy
from verifier_service.validation import InvalidRequest, check_decode_request

log = logging.getLogger(__name__)

FINISH_REASONS = {STOP: common_pb2.FINISH_REASON_STOP, LENGTH: common_pb2.FINISH_REASON_LENGTH}


class VerifierServicer(verifier_pb2_grpc.VerifierServiceServicer):
    def __init__(self, engine: Engine, tokenizer, info: common_pb2.ModelInfo, config: VerifierConfig,
                 draft: DraftTier | DraftLink | None):
        self.engine = engine
        self.tokenizer = tokenizer
        self.info = info
        self.config = config
        self.draft = draft
        self.sequences = SequenceRegistry(config.max_sequences, config.max_cache_tokens, config.sequence_ttl_s)
        self._grammar_compiler: GrammarCompiler | None = None  # built at the first constraint
        self.round_cost = RoundCost()  # round time against block size, and acceptance: shared by every request

    async def GetModelInfo(self, request, context):
        return verifier_pb2.GetModelInfoResponse(info=self.info)

    async def Decode(self, request: verifier_pb2.DecodeRequest, context: grpc.aio.ServicerContext):
        self.sequences.start_reaper()
        if request.tokenizer_fingerprint and request.tokenizer_fingerprint != self.info.tokenizer_fingerprint:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, (
                f"the caller tokenized with another tokenizer (fingerprint {request.tokenizer_fingerprint[:16]}) "
                f"than this verifier's model {self.info.model} ({self.info.tokenizer_fingerprint[:16]}): its ids "
                "would stand for other text. Point the gateway's --model at the verifier's model"))
        try:
            spec = check_decode_request(request, self.engine.vocab_size, self.engine.max_context,
                                        self.config.max_speculative_tokens)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if constraint_set(request.constraint):
            spec.grammar = await self._grammar(request.constraint, context)
            spec.constraint = request.constraint
        try:
            key, live = self.sequences.admit(spec.request_id, len(spec.prompt_ids) + spec.max_tokens)
        except CapacityExceeded as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        live.on_reap = functools.partial(self._end_reaped_call, context, spec.request_id)
        generated = 0
        speculation = self._speculation(spec, request.constraint if spec.grammar is not None else None)
        stopper = StopChecker(list(self.info.eos_token_ids), spec.max_tokens, spec.stop, self.tokenizer,
                              spec.prompt_ids)
        rounds = decode(self.engine, spec, speculation, stopper)
        try:
            async for output in rounds:
                generated += len(output.token_ids)
                message = verifier_pb2.DecodeResponse(token_ids=output.token_ids)
                if output.finish_reason:
                    message.finish_reason = FINISH_REASONS[output.finish_reason]
                    message.matched_stop = output.matched_stop
                    message.speculation.CopyFrom(speculation.stats.to_proto())
                    message.usage.CopyFrom(common_pb2.Usage(prompt_tokens=len(spec.prompt_ids),
                                                            completion_tokens=generated))
                    metrics.REQUESTS.labels(finish_reason=output.finish_reason).inc()
                metrics.GENERATED_TOKENS.inc(len(output.token_ids))
                live.write_started()  # the yield returns once gRPC has written it: the client's reading
                yield message
                live.write_done()
        finally:
            self.sequences.release(key)
            # Free the KV cache and end the draft's stream now, not whenever the generator is collected.
            try:
                await rounds.aclose()
            except RuntimeError:  # cancelled mid-round: the generator's own finally frees them
                pass

    async def _grammar(self, constraint: common_pb2.Constraint, context) -> SequenceGrammar:
        """The request's grammar matcher; the constraint compiles off the event loop, once per distinct one."""
        if not getattr(self.engine, "takes_constraints", False):
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, (
                f"constraint: the {self.engine.name} engine does not support structured outputs yet; "
                "use the transformers engine (--engine transformers) or send the request without a constraint"))
        if self._grammar_compiler is None:
            self._grammar_compiler = GrammarCompiler(self.tokenizer, self.engine.vocab_size,
                                                     list(self.info.eos_token_ids),
                                                     self.config.grammar_compile_timeout_s)
        try:
            compiled = await self._grammar_compiler.compile(constraint)
        except GrammarError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except GrammarBusy as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        return await asyncio.to_thread(self._grammar_compiler.matcher, compiled, constraint)

    def _speculation(self, spec: DecodeSpec, constraint: common_pb2.Constraint | None = None) -> RequestSpeculation:
        """The request's draft session (none without a draft service) and its k policy; a constrained request's
        draft gets the constraint, so that its grammar drafts too."""
        policy = SpeculationPolicy(self.config.num_speculative_tokens, self.config.max_speculative_tokens,
                                   spec.num_speculative_tokens, self.config.spec_max_concurrency, self.round_cost,
                                   spec.sampling.greedy, self.draft is not None and self.draft.sizes_blocks,
                                   self.config.far_draft, self.config.hybrid_threshold == "priced")
        draft = None
        if self.draft is not None:
            # An engine that takes no q (vLLM's custom proposers) gets greedy drafts: one-hot q is then exact.
            sampling = spec.sampling if self.engine.takes_draft_probs else SamplingParams()
            constrained = None if constraint is None else Constrained(constraint, len(spec.prompt_ids))
            draft = self.draft.session(spec.request_id, sampling, spec.tenant, constrained)
        return RequestSpeculation(policy, draft, trace.get_current_span(), lambda: len(self.sequences.live))

    async def _end_reaped_call(self, context, request_id: str) -> None:
        """The reaper dropped this call's sequence: tell the client why (it is waiting otherwise)."""
        try:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                f"request {request_id}: the client took no message for "
                                f"{self.config.sequence_ttl_s:g} s while one was ready (--sequence-ttl-s: it "
                                "stopped reading); its sequence was dropped")
        except Exception as exc:  # noqa: BLE001 (abort raises by design; a finished call raises too)
            log.debug("request %s: reaped call ended: %r", request_id, exc)
