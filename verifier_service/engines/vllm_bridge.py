"""Between vLLM's engine step and our draft service: one batched call per step, per-sequence state.

vLLM runs the rounds here: each engine step verifies every live sequence's draft block in one
batched forward pass and samples with vLLM's rejection sampler. The StepDrafter does the rest of
what the transformers engine's round loop does, for every row of the batch at once, through the
same per-request `RequestSpeculation`:

    for each row that emitted tokens this step:       (StepRows, from vllm_scheduler.DraftScheduler)
        speculation.record(round)                     # accepted = emitted - 1: the one place
        k = speculation.block_size(..., batch)        # adaptive, per sequence, for the whole step
    blocks = gather(speculation.propose(row) ...)     # concurrent Propose streams, one deadline
    step_done(seconds)                                # the step's time against the tokens it computed

The engine hands the blocks to vLLM's scheduler, which sends them to every rank with the next step, at
one GPU or several (vllm_scheduler.py).

A row's block lengthens the step for every row, so each row's k is chosen for the step's tokens per
second (`Batch`), from the server-wide `StepCost` that every decode-only step feeds.

It runs on the engine's step thread, between vLLM's steps; the draft streams live on the server's event loop.
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
class StepRows:
    """One engine step's batch, in the model runner's row order (vllm_scheduler.DraftScheduler reports it)."""

    request_ids: list[str]  # [rows] vLLM's request ids
    emitted: list[list[int]]  # [rows][tokens the step emitted: accepted drafts + 1; empty while prefilling]
    verified: list[int]  # [rows] draft tokens the step verified
    step_tokens: int  # tokens the step computed, prefill chunks included


@dataclasses.dataclass
class StepSequence:
    """One sequence's drafting state between vLLM steps."""

    spec: DecodeSpec
    speculation: RequestSpeculation
    context: otel_context.Context  # the Decode call's trace context: draft calls join its trace
    fallback: str = ""  # why the previous step's block was empty, where it should not have been
    draft_wait_s: float | None = None  # how long the previous step waited for its blocks
    last_step_at: float = dataclasses.field(default_factory=time.perf_counter)


class StepDrafter:
    def __init__(self, loop: asyncio.AbstractEventLoop, max_context: int, timeout_s: float):
        self.loop = loop
        self.max_context = max_context
        self.timeout_s = timeout_s
        self.sequences: dict[str, StepSequence] = {}  # by vLLM request id
        self.step_cost = StepCost()
        self._step_tokens: int | None = None  # the tokens the last step computed, if it only decoded

    def add(self, request_id: str, sequence: StepSequence) -> None:
        self.sequences[request_id] = sequence

    def remove(self, request_id: str) -> None:
        self.sequences.pop(request_id, None)

    def propose(
        self,
        rows: StepRows,
        context: typing.Callable[[str], typing.Sequence[int] | None],  # a live request's tokens; None once finished
        max_k: int,
    ) -> list[list[int]]:
        """After each engine step: record the step's rounds, then one draft block per row (may be empty)."""
        now = time.perf_counter()
        request_ids = rows.request_ids
        blocks: list[list[int]] = [[] for _ in request_ids]
        decoding = [(row, sequence, len(rows.emitted[row])) for row, sequence in
                    ((row, self.sequences.get(request_id)) for row, request_id in enumerate(request_ids))
                    if sequence is not None and rows.emitted[row]]
        verified = sum(1 + rows.verified[row] for row, _sequence, _emitted in decoding)  # rows + their draft tokens
        emitted = sum(count for _row, _sequence, count in decoding)
        jobs = []
        # Another row in the step, or a prefill (more tokens computed than the rows' own): the step's time is the batch's.
        shared = len(request_ids) > 1 or rows.step_tokens != verified
        for row, sequence, count in decoding:
            self._record_step(sequence, rows.verified[row], count, now, shared)
            tokens = context(request_ids[row])
            if tokens is None:  # it finished in this step
                continue
            length = len(tokens)
            generated = length - len(sequence.spec.prompt_ids)
            batch = self.step_cost.batch(verified - rows.verified[row], emitted - count)
            k = min(max_k, sequence.speculation.block_size(sequence.spec.max_tokens - generated,
                                                           self.max_context - length, batch, length))
            sequence.draft_wait_s = None
            sequence.fallback = "" if k else sequence.speculation.policy.off_reason
            if k:
                jobs.append((row, sequence, list(tokens), k))
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
                blocks[row] = block[:max_k]  # vLLM reserves max_k draft slots a row; what it verified is recorded
                sequence.fallback, sequence.draft_wait_s = reason, waited_s
        # A step that computed more than its rows and their blocks prefilled too: its time says nothing of decoding.
        self._step_tokens = verified if decoding and rows.step_tokens == verified else None
        return blocks

    def step_done(self, seconds: float) -> None:
        """The engine step whose rows propose took, took `seconds` (its forward pass and vLLM's own work)."""
        if self._step_tokens is not None:
            self.step_cost.observe(self._step_tokens, seconds)
            self._step_tokens = None
            base_s, per_token_s = self.step_cost.line()
            metrics.STEP_BASE_TIME.set(base_s)
            metrics.STEP_TOKEN_TIME.set(per_token_s)

    @staticmethod
    def _record_step(sequence: StepSequence, verified: int, emitted: int, now: float, shared: bool) -> None:
        """The step verified `verified` draft tokens of this sequence and emitted `emitted` (accepted + 1)."""
        accepted = min(emitted - 1, verified)
        sequence.speculation.record(Round(verified, accepted, now - sequence.last_step_at, shared=shared,
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
