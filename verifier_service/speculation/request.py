"""One request's speculation: its draft session, its k policy, its statistics, and the one place a round is recorded.

Both engines drive rounds differently (our loop for transformers, vLLM's batched steps), but
each verified round goes through `RequestSpeculation.record`, which updates, in one place:
the request's `SpeculationStats` (returned to the client), the vLLM-named Prometheus counters,
the fallback count, the policy's observations (acceptance, round time), the draft-wait and
forward-time histograms, and the request span's `round` event.

Glossary (vLLM's conventions, vllm/v1/spec_decode/metrics.py):
- a draft is one non-empty block of draft tokens verified in one round;
- accepted tokens exclude the target's own token (correction or bonus) that every round emits;
- mean accepted length = 1 + accepted / drafts, so it counts that token.

A round whose block was asked of the draft but came back empty (the draft failed, timed out, or sent
something unusable) is a plain step for the statistics, but not for the policy: its time includes the
wait for the draft, which is the price of drafting, not of a plain step. The policy sees it as a block
of the asked size with nothing accepted, so a draft too slow to answer in time turns speculation off
instead of making plain steps look slow. Where the draft had nothing to propose (no n-gram match), the
policy sees a plain step that was asked for (`SpeculationPolicy.observe`'s asked_k: a retry that
found nothing is over), timed without the wait; so does a block the policy found too weak to verify
(`SpeculationPolicy.cut_block`, fallback "weak_draft").

A far draft (its answer takes a good share of a step: another host, a slow model) need not be waited
for: where the speedup model says so (`SpeculationPolicy.step_while_drafting`, --far-draft), the round
asks for the block and decodes a plain step meanwhile ("stepped"), and the next round verifies the
block after the step's token if the draft's first token was that one (`DraftSession.prefetch`,
`at_hand`). The plain step emits what plain decoding would; the block is then a valid draft for the
tokens after it, so every choice stays lossless.

A draft that sizes some of its blocks at no forward's cost (the hybrid's suffix side) is asked for those alone in
rounds the policy would decode plainly because its model's blocks do not pay (`SpeculationPolicy.sized_only_k`,
NextBlock.sized_only); such blocks are priced apart from the blocks k sizes (`SpeculationPolicy.observe`'s sized).

The hybrid's model reads the sequence when it first drafts, a cost its request pays once: until it has, a round
whose k the policy chose asks the suffix side alone unless the model's blocks, over the rest of the request, would
save more than that read (`SpeculationPolicy.model_read_pays`, with the draft's measured read time per token,
`DraftPace.read_s`; off reason "read_not_paying").

A draft that reads a long prompt for longer than a round waits (a model draft's prefill) is not abandoned: the
stream stays open, each round decodes a plain step meanwhile ("reading_prompt"), and the first answer is taken
as a prefetched block's when it comes (`DraftSession.at_hand`).
"""

from __future__ import annotations

import dataclasses
import typing

from opentelemetry import trace

from specdec.runtime import metrics
from specdec.decoding.draft_block import DraftBlock
from specdec.v1 import common_pb2
from verifier_service.draft.client import DraftSession
from verifier_service.speculation.policy import Batch, SpeculationPolicy


@dataclasses.dataclass
class SpeculationStats:
    """Speculation statistics for one request; `to_proto` gives the wire's SpeculationStats."""

    num_rounds: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_fallback_rounds: int = 0
    num_ahead_used: int = 0  # blocks drafted ahead and used: no round trip (pipelined drafting)
    num_ahead_discarded: int = 0
    num_stepped_rounds: int = 0  # plain steps decoded while a far draft drafted (fallback "stepped")
    num_prefetched_used: int = 0  # blocks asked during such a step and verified after it: no round trip
    num_forced_tokens: int = 0  # of num_draft_tokens, those the request's grammar forced (structured outputs)
    accepted_per_position: list[int] = dataclasses.field(default_factory=list)

    def add(self, num_draft_tokens: int, num_accepted: int, num_forced: int = 0) -> None:
        self.num_rounds += 1
        if not num_draft_tokens:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_forced_tokens += num_forced
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_position) < num_draft_tokens:
            self.accepted_per_position += [0] * (num_draft_tokens - len(self.accepted_per_position))
        for position in range(num_accepted):
            self.accepted_per_position[position] += 1

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
            num_ahead_used=self.num_ahead_used,
            num_ahead_discarded=self.num_ahead_discarded,
            num_stepped_rounds=self.num_stepped_rounds,
            num_prefetched_used=self.num_prefetched_used,
            num_forced_tokens=self.num_forced_tokens,
        )


@dataclasses.dataclass
class Round:
    """One verified round, as either engine measured it."""

    num_draft_tokens: int  # k' verified (0: a plain step)
    num_accepted: int  # draft tokens accepted, 0..k'
    seconds: float  # wall time of the round: draft wait + transport + forward + decision
    draft_wait_s: float | None = None  # time spent waiting for the block (None: not measured by this engine)
    forward_s: float | None = None  # the target's forward pass (None: measured per engine step elsewhere)
    fallback: str = ""  # why the round had no draft although the request speculates ("" otherwise)
    target_token: int | None = None  # the target's own token (correction or bonus)
    shared: bool = False  # the step verified other sequences too (vLLM): its time is the batch's, not this row's


# Why a round has no block although the draft was asked for one (DraftSession.propose; "timeout": the
# vLLM engine's step deadline, vllm_bridge)
DRAFT_GAVE_NOTHING = frozenset({"failed", "unavailable", "closed", "timeout", "ahead_discarded", "ahead_invalid"})


# A round whose ask the draft answered (a block, maybe empty, maybe cut as too weak): its wait is the draft's pace
DRAFT_ANSWERED = frozenset({"", "weak_draft"})


class RequestSpeculation:
    """Per request: the draft session (None without a draft service), the policy and the statistics."""

    def __init__(self, policy: SpeculationPolicy, draft: DraftSession | None, span: trace.Span | None = None,
                 live_sequences: typing.Callable[[], int] = lambda: 1):
        self.policy = policy
        self.draft = draft
        self.span = span if span is not None else trace.get_current_span()
        self.live_sequences = live_sequences
        self.stats = SpeculationStats()
        self.block_came_ahead = False  # the last proposed block was drafted ahead, or asked during the last step
        self.block_prefetched = False  # the last proposed block was asked during the last (plain) step
        self.asked_k = 0  # the k the draft was last asked for (0: not asked)
        self.block = DraftBlock.empty()  # the last block proposed, as cut for verification
        self.opening = False  # the last ask opened the draft stream (the draft read the prompt before drafting)
        self.read_tokens = 0  # the tokens the draft read in it (the sequence so far)
        self.asked_model = False  # the draft's model was asked and answered (or is reading): not an opening any more
        self.sized_only = False  # this round asks only for a block the draft sizes at no forward's cost
        self.min_sized = 0  # the shortest match at which such a block answers this round (NextBlock.min_sized)

    def block_size(self, remaining_tokens: int, remaining_context: int, batch: Batch | None = None,
                   context_length: int = 0) -> int:
        """k for the next round (0: a plain step); `batch`: the rest of the engine step the block would join;
        context_length: the sequence's tokens so far (what a draft that has not read them would read)."""
        self.sized_only, self.min_sized = False, 0
        if self.draft is None:
            return 0
        k = self.policy.block_size(remaining_tokens, remaining_context, self.live_sequences(), batch,
                                   self.draft.link.pace)
        link = self.draft.link
        if not link.sizes_some_blocks:
            return k
        if k and not self.asked_model and not self.draft.reading_prompt and not self.policy.model_read_pays(
                k, remaining_tokens, link.pace.read_s(context_length)):
            # the model's blocks pay, but not for its read of the sequence over what is left of the request: its free
            # side alone is asked, as where the model's blocks do not pay
            k = self.policy.sized_only_k(remaining_tokens, remaining_context, model_unread=True)
            self.sized_only, self.min_sized = k > 0, self.policy.min_sized(k, sized_only=True)
        elif k:  # which of the draft's blocks is worth more, by the prices of both (the hybrid: suffix or model)
            self.min_sized = self.policy.min_sized(k, pace=link.pace)
        elif not self.draft.reading_prompt:
            # the draft's model blocks do not pay, but its free ones may (the hybrid's suffix side): ask for those. A
            # model block asked during the last plain step and not yet taken is dropped by that ask (its answer,
            # stale, is skipped); kept instead, it would stop every sized-only ask until the model paid again
            k = self.policy.sized_only_k(remaining_tokens, remaining_context)
            self.sized_only, self.min_sized = k > 0, self.policy.min_sized(k, sized_only=True)
        return k

    def draft_wait_s(self, k: int, opening: bool = False) -> float:
        """How long this round waits for a block of k: the draft's measured pace, within the flag's floor and the
        wait a block of k can pay for (`verifier_service.draft.pace.DraftPace.wait_s`)."""
        link = self.draft.link
        return link.pace.wait_s(k, link.timeout_s, self.policy.draft_wait_cap(k), opening)

    async def propose(self, tokens: list[int], k: int) -> tuple[DraftBlock, str]:
        """Up to k draft tokens after `tokens`, and why the block is empty where it is ("" otherwise).

        In order: the answer to the block asked during the last plain step, if it has arrived and fits the tokens
        decoded since (no wait); else, where waiting for a far draft costs more than a plain step meanwhile
        (`SpeculationPolicy.step_while_drafting`) and no block drafted ahead is here, ask without waiting and
        decode a plain step ("stepped"), unless a draft that sizes some blocks at no forward's cost (the hybrid's
        suffix side) has one at once, which is verified instead; else ask and wait, as always."""
        self.block_came_ahead = self.block_prefetched = False
        self.asked_k = 0
        self.block = DraftBlock.empty()
        if self.draft is None or k == 0:
            return self.block, self.policy.off_reason if self.draft is not None else ""
        if self.sized_only:
            block, reason = await self._sized_block(tokens, k, self.min_sized)
            return block, reason or ("" if block.token_ids else self.policy.off_reason)
        block, first_token_accepted = await self.draft.at_hand(tokens, k, self.draft_wait_s(k))
        if first_token_accepted is not None:
            self.policy.observe_first_token(first_token_accepted)
        if block is not None:
            self.block_came_ahead = self.block_prefetched = True
            return self._verified(block, "", k)
        if self.draft.reading_prompt:  # the draft's first answer is still to come: a plain step, asking nothing
            return self.block, "reading_prompt"
        # the hybrid's first ask of its model, after sized-only asks or suffix blocks, has the model read the prompt:
        # asked as an opening (its longer wait, then plain steps until it answers), never as a prefetch, whose answer
        # is waited for as an ordinary block's: timed out, it ended the stream, and the next ask read the prompt again
        first_model_ask = self.draft.link.sizes_some_blocks and not self.asked_model
        if self.policy.step_while_drafting(k) and not self.draft.ahead_ready(tokens) and not first_model_ask:
            if self.draft.link.sizes_some_blocks:  # a block the draft sizes at no forward's cost beats a plain step
                block, reason = await self._sized_block(tokens, k, 1)
                if block.token_ids or reason:
                    self.sized_only = True  # recorded as a sized-only round: it says nothing of the model's blocks
                    return block, reason
            return self.block, await self.draft.prefetch(tokens, k, self.min_sized) or "stepped"
        self.asked_k = k
        # the model's first ask reads the prompt, also where sized-only asks, or asks its suffix side answered (the
        # hybrid's model reads when it first drafts), opened the stream before it
        self.opening = self.draft.stream is None or not self.asked_model
        self.read_tokens = len(tokens) if self.opening else 0
        block, reason = await self.draft.propose(tokens, k, self.draft_wait_s(k, self.opening),
                                                 min_sized=self.min_sized, opening=self.opening)
        self.asked_model = self.asked_model or not block.sized_by_draft
        self.block_came_ahead = block.ahead
        return self._verified(block, reason, k)

    async def _sized_block(self, tokens: list[int], k: int, min_sized: int) -> tuple[DraftBlock, str]:
        """A block only if the draft sizes it at no forward's cost (NextBlock.sized_only), as it will be verified, and
        why it is empty where it is. No model forward is asked: the answer is at once (the link's floor is its wait)."""
        block, reason = await self.draft.propose(tokens, k, self.draft.link.timeout_s, sized_only=True,
                                                 min_sized=min_sized)
        return self._verified(block, reason, k)

    def _verified(self, block: DraftBlock, reason: str, k: int) -> tuple[DraftBlock, str]:
        """The block as it will be verified, and why it is empty where it is: only as far as the policy finds its
        tokens pay (`SpeculationPolicy.cut_block`), so none of a block too weak to pay ("weak_draft"). A block the
        draft sized by its evidence, longer than the k asked, is cut likewise (never past the policy's largest k), or,
        where the policy did not choose k (a request's fixed k, a retry), to k."""
        n = self.policy.cut_block(len(block.token_ids), block.num_chained, block.num_forced, block.sized_by_draft)
        if block.sized_by_draft and self.policy.cut_times is None:
            n = min(n, k)
        self.block = block.cut(n)
        return self.block, reason or ("weak_draft" if block.token_ids and not self.block.token_ids else "")

    def record(self, round_: Round) -> None:
        """The one place a verified round is counted: statistics, metrics, fallback, policy, trace."""
        # of the verified tokens, those the draft chained and those the grammar forced (the block's last ones: an
        # engine that verifies fewer drops those first)
        verified = self.block.cut(round_.num_draft_tokens)
        chained, forced = verified.num_chained, verified.num_forced
        self.stats.add(round_.num_draft_tokens, round_.num_accepted, forced)
        metrics.record_round(round_.num_draft_tokens, round_.num_accepted, forced)
        if self.draft is not None:
            self.draft.accepted(round_.num_accepted)
            self.stats.num_ahead_used, self.stats.num_ahead_discarded = self.draft.ahead.used, self.draft.ahead.discarded
            self.stats.num_prefetched_used = self.draft.ahead.prefetched["used"]
            self.stats.num_stepped_rounds += round_.fallback == "stepped"
            if round_.fallback:
                self.stats.num_fallback_rounds += 1
                metrics.FALLBACK_ROUNDS.labels(reason=round_.fallback).inc()
        # a shared step's time is for StepCost, not RoundCost; a step decoded while the draft drafted is not a plain
        # step's price where the two share cores: it is timed with the block it waited for (`RoundCost.ready_time`)
        stepped = round_.fallback == "stepped"
        seconds = 0.0 if round_.shared or stepped else round_.seconds
        # this round's ask; reset, for the vLLM engine records a step's round before it asks for the next block
        asked_k, self.asked_k = self.asked_k, 0
        reading = self.opening and round_.fallback == "timeout"  # the stream is kept: its answer comes later
        # a block the draft sized by its evidence (the hybrid's suffix side) took no model forward: it says nothing
        # of how long a block of asked_k takes when the model drafts it
        if asked_k and not self.block_came_ahead and round_.draft_wait_s is not None and not self.block.sized_by_draft:
            if not reading:  # what asking costs when the answer is waited for (a prompt is read once a request)
                self.policy.cost.observe_wait(round_.draft_wait_s)
            if round_.fallback == "timeout":  # the draft takes longer than this wait: the next one is longer
                self.draft.link.pace.timed_out(asked_k, round_.draft_wait_s, self.opening, self.read_tokens)
            elif round_.fallback in DRAFT_ANSWERED:
                self.draft.link.pace.observe(asked_k, round_.draft_wait_s, self.opening, self.read_tokens)
                if self.opening and round_.num_draft_tokens:  # (a round without a block is priced without the wait)
                    seconds = self._without_prompt_read(seconds, asked_k, round_.draft_wait_s)
        if self.draft is not None and self.draft.prefetch_timing is not None:
            # a block asked during a plain step: from its ask to its answer (or to giving up on it) is the draft's pace
            # as well, and where the policy steps while drafting, the only measure of it
            prefetched_k, prefetch_s, answered, sized = self.draft.prefetch_timing
            self.draft.prefetch_timing = None
            if not answered:
                self.draft.link.pace.timed_out(prefetched_k, prefetch_s)
            elif not sized:
                self.draft.link.pace.observe(prefetched_k, prefetch_s)
            if not sized:  # what stepping while the model drafts costs
                self.policy.cost.observe_ready(prefetched_k, prefetch_s)
        if not round_.num_draft_tokens and round_.fallback in DRAFT_GAVE_NOTHING and asked_k and not reading:
            self.policy.observe(asked_k, 0, seconds)  # drafting's price, not a plain step's
        elif not round_.num_draft_tokens and (asked_k or self.sized_only):
            # asked, and nothing worth verifying came (no match, or a block too weak, or the draft is still reading
            # the prompt: a cost of the request's first round, not of a block of k): a plain step after the wait;
            # the wait is drafting's (`RoundCost.wait`), not a plain step's
            wait = round_.draft_wait_s if round_.draft_wait_s is not None else 0.0
            self.policy.observe(0, 0, max(seconds - wait, 0.0), asked_k=asked_k)
        else:
            self.policy.observe(round_.num_draft_tokens, round_.num_accepted, seconds, asked_k=asked_k,
                                num_chained=chained, num_forced=forced, sized=self.block.sized_by_draft)
        hybrid_unread = self.draft is not None and self.draft.link.sizes_some_blocks and not self.asked_model
        if hybrid_unread and not self.policy.fixed:
            # the hybrid's model has not drafted yet: what its free side's rounds bring, against which its read is
            # priced. A round whose block was cut as too weak is not one the model would draft: the free side's match
            # answers it (by the draft's rule, any match). Only where the policy chooses k, as only there the read is
            # weighed: a request with speculation off (k = 0) asks the free side nothing, and its plain steps, tallied,
            # made the model's read look worth it to every request after it
            self.policy.observe_free_round(round_.num_accepted + 1,
                                           not round_.num_draft_tokens and round_.fallback != "weak_draft")
        if round_.forward_s is not None:
            metrics.VERIFY_FORWARD_TIME.observe(round_.forward_s)
            if not round_.shared and not stepped:
                self.policy.cost.observe_forward(round_.num_draft_tokens, round_.forward_s)
        if round_.draft_wait_s is not None:
            metrics.DRAFT_WAIT_TIME.observe(round_.draft_wait_s)
        event: dict[str, typing.Any] = {"k": round_.num_draft_tokens, "accepted": round_.num_accepted,
                                        "round_ms": round(round_.seconds * 1000, 3)}
        if asked_k:
            event["asked_k"] = asked_k  # the block the draft was asked for (k verifies what came, cut to what pays)
        if self.min_sized:
            event["min_sized"] = self.min_sized  # the match at which the draft's free side answered (NextBlock.min_sized)
        if round_.target_token is not None:
            event["target_token"] = round_.target_token
        if round_.forward_s is not None:
            event["forward_ms"] = round(round_.forward_s * 1000, 3)
        if round_.draft_wait_s is not None:
            event["draft_wait_ms"] = round(round_.draft_wait_s * 1000, 3)
        if round_.num_draft_tokens:
            event["ahead"] = self.block_came_ahead  # drafted ahead (no round trip) or on request
            if self.block_prefetched:
                event["prefetched"] = True  # asked during the plain step before: no wait either
            if self.block.sized_by_draft:
                event["sized"] = len(self.block.token_ids)  # sized by the draft's evidence (the hybrid's suffix side), as drafted
                # the share of the accepted tokens such blocks' price expected that they brought (after this one)
                event["borne_out"] = round(self.policy.sized_borne_out(), 3)
            if chained:
                event["chained"] = chained  # the block's tokens chained past the draft's match
            if forced:
                event["forced"] = forced  # the block's last tokens, forced by the request's grammar
        if round_.fallback:
            event["fallback"] = round_.fallback
        self.span.add_event("round", event)

    def _without_prompt_read(self, seconds: float, asked_k: int, draft_wait_s: float) -> float:
        """A stream's first round, as the policy prices it: without the draft's prompt read, which a request pays
        once, not every block (the pace learns it apart, `DraftPace.opening`). Priced with it, a few cold first
        rounds made blocks look unable to pay even when accepted whole, and the hopeless verdict turned speculation
        off server-wide. 0.0 (not timed) where the draft's block time is not known yet: nothing tells the prompt's
        part of the wait from the block's."""
        block_s = self.draft.link.pace.predicted(asked_k)
        if block_s is None:
            return 0.0
        return max(seconds - max(draft_wait_s - block_s, 0.0), 0.0)

    def close(self, final_tokens: list[int] | None) -> None:
        """End the draft stream, which frees the draft's copy of the sequence.

        final_tokens: the whole finished sequence (prompt + output), or None after a cancel or failure."""
        if self.draft is not None:
            self.draft.close(final_tokens)
