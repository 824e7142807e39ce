"""Between vLLM's engine step and our draft service: one batched call per step, per-sequence state.

vLLM runs the rounds here: each engine step verifies every live sequence's draft block in one
batched forward pass and samples with vLLM's rejection sampler. The StepDrafter does the rest of
what the transformers engine's round loop does, for every row of the batch at once, through the
same per-request `RequestSpeculation`:

    for each row that emitted tokens this step:
        speculation.record(round)                     # accepted = emitted - 1: the one place
        k = speculation.block_size(..., batch)        # adaptive, per sequence, for the whole step
    blocks = gather(speculation.propose(row) ...)     # concurrent Propose streams, one deadline
    step_done(seconds)                                # the step's time against the tokens it computed

A row's block lengthens the step for every row, so each row's k is chosen for the step's tokens per
second (`Batch`), from the server-wide `StepCost` that every decode-only step feeds.

It runs on vLLM's step thread; the draft streams live on the server's event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import typing

from opentelemetry import context as otel_context

from specdec.runtime import metrics
from verifier_service.engines.decode_loop import DecodeSpec
from verifier_service.speculation.request import RequestSpeculation, Round
from verifier_service.speculation.policy import StepCost


@dataclasses.dataclass
class StepSequence:
    """One sequence's drafting state between vLLM steps."""

    spec: DecodeSpec
    speculation: RequestSpeculation
    context: otel_context.Context  # the Decode call's trace context: draft calls join its trace
    last_k: int = 0  # draft tokens handed to vLLM at the previous step
    fallback: str = ""  # why the previous step's block was empty, where it should not have been
    draft_wait_s: float | None = None  # how long the previous step waited for its blocks
    last_step_at: float = dataclasses.field(default_factory=time.perf_counter)


class StepDrafter:
    current: StepDrafter | None = None  # the one vLLM's RemoteDraftProposer finds

    def __init__(self, loop: asyncio.AbstractEventLoop, max_context: int, timeout_s: float):
        self.loop = loop
        self.max_context = max_context
        self.timeout_s = timeout_s
        self.sequences: dict[str, StepSequence] = {}  # by vLLM request id
        self.step_cost = StepCost()
        self._step: tuple[int, float] | None = None  # this step's (tokens computed, draft wait), if it only decoded

    def add(self, request_id: str, sequence: StepSequence) -> None:
        self.sequences[request_id] = sequence

    def remove(self, request_id: str) -> None:
        self.sequences.pop(request_id, None)

    def propose(
        self,
        request_ids: list[str],  # [rows]
        sampled_token_ids: list[list[int]],  # [rows][emitted this step]
        num_tokens: typing.Sequence[int],  # [>= rows]
        token_ids: typing.Any,  # numpy [>= rows, max_model_len]
        max_k: int,
        step_tokens: int | None = None,  # tokens this step computed (vLLM's total_num_scheduled_tokens)
    ) -> list[list[int]]:
        """Called by vLLM once per step: record the step, then one draft block per row (may be empty)."""
        now = time.perf_counter()
        blocks: list[list[int]] = [[] for _ in request_ids]
        decoding = [(row, sequence, len(sampled_token_ids[row])) for row, sequence in
                    ((row, self.sequences.get(request_id)) for row, request_id in enumerate(request_ids))
                    if sequence is not None and row < len(sampled_token_ids) and sampled_token_ids[row]]
        verified = sum(1 + sequence.last_k for _row, sequence, _emitted in decoding)  # rows + their draft tokens
        emitted = sum(count for _row, _sequence, count in decoding)
        jobs = []
        # Another row in the step, or a prefill (more tokens computed than the rows' own): the step's time is the batch's.
        shared = len(request_ids) > 1 or (step_tokens is not None and step_tokens != verified)
        for row, sequence, count in decoding:
            self._record_step(sequence, count, now, shared)
            length = int(num_tokens[row])
            generated = length - len(sequence.spec.prompt_ids)
            batch = self.step_cost.batch(verified - sequence.last_k, emitted - count)
            k = min(max_k, sequence.speculation.block_size(sequence.spec.max_tokens - generated,
                                                           self.max_context - length, batch))
            sequence.last_k, sequence.draft_wait_s = 0, None
            sequence.fallback = "" if k else sequence.speculation.policy.off_reason
            if k:
                jobs.append((row, sequence, token_ids[row, :length].tolist(), k))
        waited_s = 0.0
        if jobs:
            # each row waits as long as its draft's measured pace asks (RequestSpeculation.draft_wait_s), the flag
            # being the floor; the step gives them all that, and a second more for the transport
            waits = [sequence.speculation.draft_wait_s(k, sequence.speculation.draft.stream is None)
                     for _row, sequence, _tokens, k in jobs]
            future = asyncio.run_coroutine_threadsafe(self._propose_all(jobs), self.loop)
            try:
                results = future.result(max([self.timeout_s, *waits]) + 1.0)
            except TimeoutError:
                future.cancel()
                results = [([], "timeout")] * len(jobs)
            waited_s = time.perf_counter() - now
            self.step_cost.observe_wait(waited_s)
            for (row, sequence, _tokens, _k), (block, reason) in zip(jobs, results):
                blocks[row] = block
                sequence.last_k, sequence.fallback, sequence.draft_wait_s = len(block), reason, waited_s
        # A step that computed more than its rows and their blocks prefilled too: its time says nothing of decoding.
        self._step = (verified, waited_s) if decoding and step_tokens == verified else None
        return blocks

    def step_done(self, seconds: float) -> None:
        """The engine step that called propose took `seconds` in all (its forward pass, the draft wait, vLLM's own)."""
        if self._step is not None:
            tokens, waited_s = self._step
            self.step_cost.observe(tokens, seconds - waited_s)
            self._step = None
            base_s, per_token_s = self.step_cost.line()
            metrics.STEP_BASE_TIME.set(base_s)
            metrics.STEP_TOKEN_TIME.set(per_token_s)

    @staticmethod
    def _record_step(sequence: StepSequence, emitted: int, now: float, shared: bool) -> None:
        """The previous step verified sequence.last_k tokens and emitted `emitted` (accepted + 1)."""
        accepted = min(emitted - 1, sequence.last_k)
        sequence.speculation.record(Round(sequence.last_k, accepted, now - sequence.last_step_at, shared=shared,
                                          draft_wait_s=sequence.draft_wait_s, fallback=sequence.fallback))
        sequence.last_step_at = now

    async def _propose_all(self, jobs) -> list[tuple[list[int], str]]:
        return await asyncio.gather(*(self._propose_one(sequence, tokens, k) for _row, sequence, tokens, k in jobs))

    @staticmethod
    async def _propose_one(sequence: StepSequence, tokens: list[int], k: int) -> tuple[list[int], str]:
        token = otel_context.attach(sequence.context)
        try:
            block, reason = await sequence.speculation.propose(tokens, k)
        finally:
            otel_context.detach(token)
        return block.token_ids, reason
