"""The round loop: draft a block, verify it in one forward pass, accept or reject, emit.

One obvious place for the loop, read top to bottom:

    state = engine.start(prompt)                    # prefill
    while not finished:
        block   = draft.propose(keep, append, k)    # over the Propose stream
        verdict = verify(state, block)              # one forward pass + the accept/reject rule
        engine.commit(state, verdict)               # explicit rollback to the accepted length
        emit(stop_checker.check(verdict.emitted))   # no token past EOS/stop/max_tokens

If the draft is missing, failing or slow, the round verifies an empty block:
plain decoding, the same tokens, just not sped up.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import typing

import torch
from opentelemetry import trace

from specdec import metrics
from specdec.sampling import SamplingParams, make_generator, probs_from_logits
from specdec.v1 import common_pb2
from verifier_service.draft_client import Block, DraftLink, DraftSession, DraftUnavailable
from verifier_service.engine import SequenceState, TransformersEngine
from verifier_service.rejection_sampler import Verdict, greedy_verify, rejection_sample
from verifier_service.speculation_policy import SpeculationPolicy
from verifier_service.stopping import StopChecker

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)


@dataclasses.dataclass
class DecodeSpec:
    """One validated request."""

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    max_tokens: int
    stop: list[str]
    num_speculative_tokens: int | None  # None: the server's default, adapted


@dataclasses.dataclass
class RoundOutput:
    token_ids: list[int]
    finish_reason: str | None = None
    matched_stop: str = ""


@dataclasses.dataclass
class Stats:
    """Speculation statistics for one request (vLLM's conventions)."""

    num_rounds: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_fallback_rounds: int = 0
    accepted_per_position: list[int] = dataclasses.field(default_factory=list)

    def record(self, num_draft_tokens: int, num_accepted: int) -> None:
        self.num_rounds += 1
        if not num_draft_tokens:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_position) < num_draft_tokens:
            self.accepted_per_position += [0] * (num_draft_tokens - len(self.accepted_per_position))
        for position in range(num_accepted):
            self.accepted_per_position[position] += 1
        metrics.record_round(num_draft_tokens, num_accepted)

    def to_proto(self) -> common_pb2.SpeculationStats:
        return common_pb2.SpeculationStats(
            num_drafts=self.num_drafts,
            num_draft_tokens=self.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens,
            acceptance_rate=self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0,
            mean_accepted_length=1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0,
            accepted_per_position=self.accepted_per_position,
            num_rounds=self.num_rounds,
            num_fallback_rounds=self.num_fallback_rounds,
        )


def verify_block(engine: TransformersEngine, state: SequenceState, block: Block, sampling: SamplingParams,
                 generator: torch.Generator) -> tuple[Verdict, float]:
    """Score the block in one forward pass, decide, and roll the cache back. Runs on the compute thread."""
    started = time.perf_counter()
    logits = engine.score(state, block.token_ids)  # [k + 1, V]
    forward_s = time.perf_counter() - started
    if sampling.greedy:
        verdict = greedy_verify(block.token_ids, logits.argmax(dim=-1).tolist())
    else:
        target_probs = probs_from_logits(logits, sampling).cpu()  # [k + 1, V]
        verdict = rejection_sample(block.token_ids, block.probs, target_probs, generator)
    engine.commit(state, verdict.num_accepted, verdict.emitted(block.token_ids))
    return verdict, forward_s


class DraftSync:
    """Keeps the draft's copy of the sequence in step with the verifier's, by position."""

    def __init__(self, link: DraftLink | None):
        self.link = link
        self.session: DraftSession | None = None
        self.synced = 0  # tokens[:synced] are known to be identical in the draft

    async def propose(self, spec: DecodeSpec, tokens: list[int], k: int) -> tuple[Block, str]:
        """A block of up to k tokens, or an empty one and the reason it is empty."""
        if k == 0 or self.link is None:
            return Block([], None), ""
        if self.session is None:
            if not self.link.available():
                return Block([], None), "backoff"
            try:
                self.session = await self.link.open(spec.request_id, tokens, spec.sampling)
            except DraftUnavailable as exc:
                log.warning("request %s: decoding without the draft: %s", spec.request_id, exc)
                return Block([], None), "unavailable"
            self.synced = len(tokens)
        try:
            block = await self.session.propose(self.synced, tokens[self.synced :], k)
        except DraftUnavailable as exc:
            log.warning("request %s: decoding without the draft: %s", spec.request_id, exc)
            self.session = None
            return Block([], None), "failed"
        self.synced = len(tokens)
        return block, ""

    def accepted(self, num_accepted: int) -> None:
        """The draft's proposal was kept up to num_accepted tokens."""
        self.synced += num_accepted

    def close(self) -> None:
        """End the draft's stream, which frees the draft's copy of the sequence."""
        if self.session is not None:
            self.session.close()
            self.session = None


async def decode(
    spec: DecodeSpec,
    engine: TransformersEngine,
    draft: DraftLink | None,
    policy: SpeculationPolicy,
    run: typing.Callable[..., typing.Awaitable],
    tokenizer,
    eos_token_ids: list[int],
    live_sequences: typing.Callable[[], int] = lambda: 1,
) -> typing.AsyncIterator[tuple[RoundOutput, Stats]]:
    """Generate for one sequence; yields each round's kept tokens with the running statistics.

    `run(fn, *args)` executes model work on the compute thread.
    """
    span = trace.get_current_span()
    stats = Stats()
    generator = make_generator(spec.sampling.seed)
    stopper = StopChecker(eos_token_ids, spec.max_tokens, spec.stop, tokenizer, spec.prompt_ids)
    sync = DraftSync(draft)
    state = await run(engine.start, spec.prompt_ids)
    try:
        while True:
            k = policy.block_size(stopper.remaining, engine.max_context - len(state.tokens), live_sequences())
            round_started = time.perf_counter()
            block, fallback_reason = await sync.propose(spec, state.tokens, k)
            draft_wait_s = time.perf_counter() - round_started
            verdict, forward_s = await run(verify_block, engine, state, block, spec.sampling, generator)
            sync.accepted(verdict.num_accepted)
            stats.record(len(block.token_ids), verdict.num_accepted)
            fallback_reason = fallback_reason or policy.off_reason
            if fallback_reason and sync.link is not None:
                stats.num_fallback_rounds += 1
                metrics.FALLBACK_ROUNDS.labels(reason=fallback_reason).inc()
            policy.observe(len(block.token_ids), verdict.num_accepted, time.perf_counter() - round_started)
            metrics.VERIFY_FORWARD_TIME.observe(forward_s)
            metrics.DRAFT_WAIT_TIME.observe(draft_wait_s)
            span.add_event("round", {
                "k": len(block.token_ids), "accepted": verdict.num_accepted, "target_token": verdict.next_token,
                "forward_ms": round(forward_s * 1000, 3), "draft_wait_ms": round(draft_wait_s * 1000, 3),
                **({"fallback": fallback_reason} if fallback_reason else {}),
            })
            checked = stopper.check(verdict.emitted(block.token_ids))
            yield RoundOutput(checked.kept, checked.finish_reason, checked.matched_stop), stats
            if checked.finish_reason:
                return
    finally:
        sync.close()
        engine.release(state)
