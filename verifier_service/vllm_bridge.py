"""Between vLLM's engine step and our draft service: one batched call per step, per-sequence state.

vLLM runs the rounds here: each engine step verifies every live sequence's draft block in one
batched forward pass and samples with vLLM's rejection sampler. The bridge does the rest of
what decode_loop.py does for the transformers engine, for every row of the batch at once:

    for each row that emitted tokens this step:
        stats.record(last_k, accepted)                # accepted = emitted - 1
        k = policy.block_size(...)                    # adaptive, per sequence
    blocks = gather(sync.propose(row) for each row)   # concurrent Propose streams, one deadline

It runs on vLLM's step thread; the draft streams live on the server's event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import typing

from opentelemetry import context as otel_context
from opentelemetry import trace

from specdec import metrics
from specdec.sampling import SamplingParams
from verifier_service.decode_loop import DecodeSpec, DraftSync, Stats
from verifier_service.draft_client import DraftLink
from verifier_service.speculation_policy import SpeculationPolicy

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Drafting:
    """One sequence's speculation state while vLLM generates it."""

    spec: DecodeSpec
    policy: SpeculationPolicy
    sync: DraftSync
    stats: Stats
    context: otel_context.Context  # the Decode call's trace context: draft calls join its trace
    last_k: int = 0  # draft tokens handed to vLLM at the previous step
    last_step_at: float = dataclasses.field(default_factory=time.perf_counter)

    @property
    def draft_spec(self) -> DecodeSpec:
        # vLLM's custom proposers pass no q: the draft proposes greedily, so that q is one-hot.
        return dataclasses.replace(self.spec, sampling=SamplingParams())


class DraftBridge:
    current: DraftBridge | None = None  # the one vLLM's RemoteDraftProposer finds

    def __init__(self, link: DraftLink | None, loop: asyncio.AbstractEventLoop, max_context: int,
                 timeout_s: float):
        self.link = link
        self.loop = loop
        self.max_context = max_context
        self.timeout_s = timeout_s
        self.sequences: dict[str, Drafting] = {}  # by vLLM request id

    def add(self, request_id: str, drafting: Drafting) -> None:
        self.sequences[request_id] = drafting

    def remove(self, request_id: str) -> None:
        """The sequence finished or was cancelled: end its draft stream (on the event loop)."""
        drafting = self.sequences.pop(request_id, None)
        if drafting is not None:
            self.loop.call_soon_threadsafe(drafting.sync.close)

    def propose(
        self,
        request_ids: list[str],  # [rows]
        sampled_token_ids: list[list[int]],  # [rows][emitted this step]
        num_tokens: typing.Sequence[int],  # [>= rows]
        token_ids: typing.Any,  # numpy [>= rows, max_model_len]
        max_k: int,
    ) -> list[list[int]]:
        """Called by vLLM once per step: record the step, then one draft block per row (may be empty)."""
        now = time.perf_counter()
        blocks: list[list[int]] = [[] for _ in request_ids]
        jobs = []
        for row, request_id in enumerate(request_ids):
            drafting = self.sequences.get(request_id)
            if drafting is None or row >= len(sampled_token_ids) or not sampled_token_ids[row]:
                continue  # not ours, or still prefilling
            self._record_step(drafting, len(sampled_token_ids[row]), now)
            length = int(num_tokens[row])
            generated = length - len(drafting.spec.prompt_ids)
            k = min(max_k, drafting.policy.block_size(drafting.spec.max_tokens - generated,
                                                      self.max_context - length, len(self.sequences)))
            drafting.last_k = 0
            if k and self.link is not None:
                jobs.append((row, drafting, token_ids[row, :length].tolist(), k))
            elif drafting.policy.off_reason and self.link is not None:
                metrics.FALLBACK_ROUNDS.labels(reason=drafting.policy.off_reason).inc()
        if jobs:
            future = asyncio.run_coroutine_threadsafe(self._propose_all(jobs), self.loop)
            try:
                results = future.result(self.timeout_s + 1.0)
            except TimeoutError:
                future.cancel()
                results = [([], "timeout")] * len(jobs)
            for (row, drafting, _tokens, _k), (block, reason) in zip(jobs, results):
                blocks[row] = block
                drafting.last_k = len(block)
                if reason:
                    metrics.FALLBACK_ROUNDS.labels(reason=reason).inc()
        return blocks

    def _record_step(self, drafting: Drafting, emitted: int, now: float) -> None:
        """The previous step verified drafting.last_k tokens and emitted `emitted` (accepted + 1)."""
        accepted = min(emitted - 1, drafting.last_k)
        drafting.sync.accepted(accepted)
        drafting.stats.record(drafting.last_k, accepted)
        drafting.policy.observe(drafting.last_k, accepted, now - drafting.last_step_at)
        drafting.last_step_at = now
        trace.get_current_span(drafting.context).add_event(
            "round", {"k": drafting.last_k, "accepted": accepted, "emitted": emitted})

    async def _propose_all(self, jobs) -> list[tuple[list[int], str]]:
        return await asyncio.gather(*(self._propose_one(drafting, tokens, k) for _row, drafting, tokens, k in jobs))

    async def _propose_one(self, drafting: Drafting, tokens, k: int) -> tuple[list[int], str]:
        token = otel_context.attach(drafting.context)
        try:
            block, reason = await drafting.sync.propose(drafting.draft_spec, tokens, k)
        finally:
            otel_context.detach(token)
        return block.token_ids, reason
