"""The reference engine: a transformers causal LM with one KV cache per sequence, and its round loop.

Sequence state is a position over a cache. Invariant: the cache holds K/V for
tokens[:cached_length]. Prefill advances the position over the prompt a chunk at a
time until cached_length == len(tokens) - 1; from then on exactly one token (the
last one emitted) is pending. A round feeds [pending, d_1..d_k] in one
forward pass, which yields the target's logits after the prefix and after each
draft token (k + 1 rows). Rollback is an explicit crop back to the accepted
length; nothing is recomputed.

The round loop (`rounds`) reads like the papers' pseudo-code:

    state = await prefill(prompt)                          # in chunks, other sequences' rounds between them
    loop:
        k       = speculation.block_size(...)              # adaptive, per request
        block   = await speculation.propose(tokens, k)     # over the Propose stream; empty on failure
        verdict = verify_block(state, block, grammar)      # one forward pass + the accept/reject rule, on
                                                           # the grammar-masked logits when constrained
                                                           # + explicit rollback to the accepted length
        speculation.record(round)                          # stats, metrics, policy, trace: one place
        yield verdict.emitted                              # the caller applies EOS/stop/max_tokens

Model work runs on one compute thread: the model is not re-entrant, and torch has its own threads.
Each prefill chunk and each round is one job on it, taken in arrival order, so a long prompt delays
another sequence's round by one chunk, not by its whole prefill (vLLM's chunked prefill, one row at a
time). A cancelled call stops between chunks. How many prompt tokens prefill at once is bounded by a
PrefillGate (prefill_gate.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import time
import typing

import torch

from specdec.modeling import models
from specdec.decoding.draft_block import DraftBlock
from specdec.decoding.grammar import SequenceGrammar
from specdec.modeling.kv_cache import new_cache, rollback_cache
from specdec.decoding.sampling import SamplingParams, make_generator, probs_from_logits
from verifier_service.engines.decode_loop import DecodeSpec
from verifier_service.prefill_gate import PrefillGate
from verifier_service.speculation.rejection_sampler import Verdict, drafter_invariant_sample, greedy_verify, rejection_sample
from verifier_service.speculation.request import RequestSpeculation, Round


@dataclasses.dataclass
class SequenceState:
    """One live sequence: its tokens and its KV cache."""

    tokens: list[int]  # prompt + completion so far
    cache: object  # transformers DynamicCache holding K/V for tokens[:cached_length]
    cached_length: int  # the position: tokens whose K/V are in the cache

    @property
    def pending(self) -> int:
        return self.tokens[-1]

    @property
    def prefilled(self) -> bool:
        """Whether every token but the pending one is in the cache (rounds may start)."""
        return self.cached_length >= len(self.tokens) - 1


class TransformersEngine:
    """Scores draft blocks with a transformers model, on CPU or CUDA."""

    name = "transformers"
    takes_draft_probs = True
    takes_constraints = True

    def __init__(self, model, device: str = "cpu", prefill_chunk_tokens: int = 0, max_prefill_tokens: int = 0):
        """prefill_chunk_tokens: prompt tokens per prefill job (0: the whole prompt in one job);
        max_prefill_tokens: the PrefillGate's budget (0: no limit)."""
        self.model = model
        self.device = torch.device(device)
        self.vocab_size = int(model.config.vocab_size)
        self.max_context = models.max_context(model)
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.prefill_gate = PrefillGate(max_prefill_tokens)
        self._compute = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify-compute")

    async def rounds(self, spec: DecodeSpec, speculation: RequestSpeculation) -> typing.AsyncIterator[list[int]]:
        """The engine contract (decode_loop.Engine): one sequence's rounds; closing the iterator frees its cache."""
        generator = make_generator(None)  # unseeded sampling only: a seeded request draws keyed by position
        state = await self._prefill(spec.prompt_ids)
        try:
            while True:
                generated = len(state.tokens) - len(spec.prompt_ids)
                k = speculation.block_size(spec.max_tokens - generated, self.max_context - len(state.tokens),
                                           context_length=len(state.tokens))
                started = time.perf_counter()
                block, fallback = await speculation.propose(state.tokens, k)
                draft_wait_s = time.perf_counter() - started
                verdict, forward_s = await self._run(verify_block, self, state, block, spec.sampling, generator,
                                                     spec.grammar)
                speculation.record(Round(
                    len(block.token_ids), verdict.num_accepted, time.perf_counter() - started,
                    draft_wait_s=draft_wait_s, forward_s=forward_s, fallback=fallback,
                    target_token=verdict.next_token))
                yield verdict.emitted(block.token_ids)
        finally:
            self.release(state)

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._compute, fn, *args)

    async def _prefill(self, prompt_ids: list[int]) -> SequenceState:
        """Prefill as a series of chunk jobs, admitted by the gate unless the prompt takes one job anyway."""
        state = SequenceState(list(prompt_ids), new_cache(self.model), 0)
        prefill_tokens = len(prompt_ids) - 1
        one_job = prefill_tokens <= self.prefill_chunk_tokens  # costs what a round costs: not held back
        async with contextlib.nullcontext() if one_job else self.prefill_gate.admitted(prefill_tokens):
            while not state.prefilled:
                await self._run(self.prefill_chunk, state)
        return state

    def start(self, prompt_ids: list[int]) -> SequenceState:
        """Prefill every prompt token but the last, which becomes the pending token (all chunks, in this thread)."""
        state = SequenceState(list(prompt_ids), new_cache(self.model), 0)
        while not state.prefilled:
            self.prefill_chunk(state)
        return state

    def prefill_chunk(self, state: SequenceState) -> None:
        """Put the next chunk of the prompt into the cache and advance the position past it."""
        end = len(state.tokens) - 1
        if self.prefill_chunk_tokens > 0:
            end = min(end, state.cached_length + self.prefill_chunk_tokens)
        self._forward(state, state.tokens[state.cached_length:end], last_only=True)
        state.cached_length = end

    def score(self, state: SequenceState, draft_token_ids: list[int]) -> torch.Tensor:
        """The target's logits after the prefix and after each draft token: [k + 1, V] float32.

        Leaves the block's K/V in the cache; `commit` then rolls back what was rejected.
        """
        return self._forward(state, [state.pending, *draft_token_ids]).float()

    def commit(self, state: SequenceState, num_accepted: int, emitted: list[int]) -> None:
        """Keep the pending token and the accepted drafts in the cache; append what the round emitted."""
        state.cached_length += 1 + num_accepted
        rollback_cache(state.cache, state.cached_length)
        state.tokens.extend(emitted)

    def release(self, state: SequenceState) -> None:
        state.cache = None

    def time_forwards(self, sizes: list[int], repeats: int = 2, context: int = 256) -> list[tuple[int, float]]:
        """(n, seconds) of a round's forward over n draft tokens after the pending one, `repeats` times for each of
        `sizes`, on a dummy sequence of `context` tokens, after one untimed pass over them (which warms the kernels);
        each block rolled back. For before serving (`verifier_service.forward_calibration`): it runs on the calling
        thread."""
        context = max(2, min(context, self.max_context - max(sizes, default=0) - 1))
        state = self.start([1 + i % (self.vocab_size - 1) for i in range(context)])
        samples = []
        try:
            for repeat in range(repeats + 1):
                for n in sizes:
                    started = time.perf_counter()
                    self.score(state, [state.pending] * n)
                    elapsed = time.perf_counter() - started
                    rollback_cache(state.cache, state.cached_length)
                    if repeat:
                        samples.append((n, elapsed))
        finally:
            self.release(state)
        return samples

    @torch.inference_mode()
    def _forward(self, state: SequenceState, token_ids: list[int], last_only: bool = False) -> torch.Tensor:
        """Run token_ids after the cached prefix. Returns logits [len(token_ids), V], or [1, V] after the last token
        with last_only: a prefill chunk's logits are never read, and with a vocabulary of 150k the head over every
        position of a chunk is a large share of its compute and [n, V] of memory."""
        input_ids = torch.tensor([token_ids], dtype=torch.long, device=self.device)  # [1, n]
        out = self.model(input_ids=input_ids, past_key_values=state.cache, use_cache=True,
                         logits_to_keep=1 if last_only else 0)
        return out.logits[0]  # [n or 1, V]


def verify_block(engine: TransformersEngine, state: SequenceState, block: DraftBlock, sampling: SamplingParams,
                 generator: torch.Generator, grammar: SequenceGrammar | None = None
                 ) -> tuple[Verdict, float]:
    """Score the block in one forward pass, decide, and roll the cache back. Runs on the compute thread.

    The rule: greedy for temperature 0; for a seeded request the coupled rule with draws keyed by (seed,
    position), so the output is the seed's plain sample whatever the draft and k; otherwise exact rejection
    sampling with the request's own random stream `generator`.

    With a grammar, the block is first cut at its first token the grammar forbids (that token could never
    be accepted), and every row of the target's logits is masked to the grammar's allowed tokens before
    the rule: each rule then runs on the masked, renormalised distribution, which is constrained decoding's
    own, so the output is what constrained decoding without speculation gives. A cut-off draft token counts
    as rejected; verdict.emitted(block.token_ids) holds for the block as proposed.
    """
    if grammar is not None:
        block = block.cut(grammar.walk(block.token_ids))
    started = time.perf_counter()
    logits = engine.score(state, block.token_ids)  # [k + 1, V]
    forward_s = time.perf_counter() - started
    if grammar is not None:
        grammar.mask(logits)
    if sampling.greedy:
        verdict = greedy_verify(block.token_ids, logits.argmax(dim=-1).tolist())
    else:
        target_probs = probs_from_logits(logits, sampling).cpu()  # [k + 1, V]
        if sampling.seed is not None:  # row 0 is the token at position len(tokens), after the pending one
            verdict = drafter_invariant_sample(block.token_ids, target_probs, sampling.seed, len(state.tokens))
        else:
            verdict = rejection_sample(block.token_ids, block.probs, target_probs, generator)
    engine.commit(state, verdict.num_accepted, verdict.emitted(block.token_ids))
    if grammar is not None:
        grammar.commit(verdict.num_accepted, verdict.next_token)
    return verdict, forward_s
