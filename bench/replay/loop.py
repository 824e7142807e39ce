"""Greedy speculation in-process, for the advisor: a replay over known continuations, and a real loop.

Both take drafts through the product's proposer contract (`draft_service.proposer.DraftSequence`):
the n-gram and suffix proposers are the draft service's own classes. Prompts run in order, and a
proposer that learns from finished outputs (suffix) learns from the earlier prompts of the same
pass: `Drafts.new_pass()` starts that state empty.

- `replay`: the target's greedy continuation of each prompt is known. Each round asks the draft
  for up to k tokens and accepts the longest prefix that matches the continuation, then the
  target's own token. Greedy verification accepts exactly that, so this is the acceptance the
  service sees at temperature 0, without running the target.
- `speculative_greedy`: the same rounds with the target running, as the verifier's transformers
  engine does them: one forward over the pending token and the block on a KV cache, rolled back
  to what was accepted. k = 0 is plain decoding through the same loop (the baseline).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Callable

from draft_service.proposer import DraftSequence
from specdec.decoding.draft_block import DraftBlock

OpenSequence = Callable[[list[int]], DraftSequence]  # prompt ids -> the draft's sequence


@dataclasses.dataclass
class Drafts:
    """A proposer the advisor can try: `new_pass()` returns an opener with fresh learnt state."""

    name: str
    new_pass: Callable[[], OpenSequence]
    sizes_blocks: bool = False  # the proposer's `sizes_blocks`: it returns fewer tokens where its evidence is weak
    # hybrid: the tokens each side drafted since the last new_pass() (a draft model's cost is only its side's)
    drafted_by: collections.Counter | None = None
    # hybrid: per sequence opened since the last new_pass(), in order, whether its model side drafted (and so read
    # the prompt: the service's hybrid reads it when its model first drafts)
    model_drafted: list[bool] | None = None


def ngram_drafts(min_n: int = 1, max_n: int = 4) -> Drafts:
    from draft_service.ngram import NgramSequence

    return Drafts("ngram", lambda: (lambda prompt_ids: NgramSequence(prompt_ids, min_n, max_n)))


def suffix_drafts(config=None) -> Drafts:
    """The draft service's suffix proposer, one global cache per pass (the service's default settings)."""
    from draft_service.suffix import SuffixProposer
    from specdec.decoding.sampling import SamplingParams

    def new_pass() -> OpenSequence:
        proposer = SuffixProposer(config)
        return lambda prompt_ids: proposer.start(prompt_ids, SamplingParams(), False)

    return Drafts("suffix", new_pass, sizes_blocks=SuffixProposer.sizes_blocks)


class ModelSequence(DraftSequence):
    """A draft model's greedy continuation, for replay: one `generate` of k_max tokens per distinct sequence.

    `memo` (shared by every sequence of a Drafts) maps a token sequence to its continuation, so
    replays at several k over the same target continuations run the draft once per position.
    """

    def __init__(self, prompt_ids: list[int], model, k_max: int, memo: dict):
        self._model, self._k_max, self._memo = model, k_max, memo
        super().__init__(prompt_ids)

    def propose(self, k: int) -> DraftBlock:
        import torch

        key = tuple(self.tokens)
        if key not in self._memo:
            with torch.inference_mode():
                out = self._model.generate(torch.tensor([self.tokens]), max_new_tokens=self._k_max, do_sample=False,
                                           temperature=None, top_p=None, top_k=None, pad_token_id=0)
            self._memo[key] = out[0, len(key):].tolist()
        block = self._memo[key][:k]
        self._extend(block)
        return DraftBlock(block, None)

    def _extend(self, token_ids: list[int]) -> None:
        self.tokens.extend(token_ids)

    def _truncate(self, length: int) -> None:
        del self.tokens[length:]


def model_drafts(model, k_max: int) -> Drafts:
    memo: dict[tuple[int, ...], list[int]] = {}
    return Drafts("model", lambda: (lambda prompt_ids: ModelSequence(prompt_ids, model, k_max, memo)))


def hybrid_drafts(model, k_max: int, min_suffix: int | None = None, live: bool = False) -> Drafts:
    """The draft service's hybrid (`draft_service.hybrid`) over the suffix proposer and the draft model's replay;
    `drafted_by` counts each side's tokens, `model_drafted` the sequences whose model side drafted.

    live: the model side is the draft service's own (`draft_service.model_draft`, a forward per token over its KV
    cache), for timing; the replay's memoises its proposals, so a second pass over the same text drafts for free.
    """
    from draft_service.hybrid import HybridConfig, HybridSequence
    from draft_service.model_draft import ModelProposer
    from specdec.decoding.sampling import SamplingParams

    suffix, memo = suffix_drafts(), {}
    min_suffix = HybridConfig.hybrid_min_suffix if min_suffix is None else min_suffix
    drafted_by: collections.Counter = collections.Counter()
    model_drafted: list[bool] = []

    class CountedHybrid(HybridSequence):
        def __init__(self, *args):
            super().__init__(*args)
            self.index = len(model_drafted)
            model_drafted.append(False)

        def propose(self, k: int) -> DraftBlock:
            block = super().propose(k)
            drafted_by[self.source] += len(block.token_ids)
            model_drafted[self.index] = model_drafted[self.index] or (self.source == "model" and bool(block.token_ids))
            return block

    def new_pass() -> OpenSequence:
        drafted_by.clear()
        model_drafted.clear()
        open_suffix = suffix.new_pass()
        if live:
            proposer = ModelProposer(model)
            return lambda prompt_ids: CountedHybrid(open_suffix(prompt_ids),
                                                    proposer.start(prompt_ids, SamplingParams(), False), min_suffix)
        return lambda prompt_ids: CountedHybrid(open_suffix(prompt_ids), ModelSequence(prompt_ids, model, k_max, memo),
                                                min_suffix)

    return Drafts("hybrid", new_pass, drafted_by=drafted_by, model_drafted=model_drafted)


@dataclasses.dataclass
class ReplayStats:
    """What the rounds of a replay (or a run) did."""

    tokens: int = 0  # emitted: accepted drafts + the target's own tokens
    accepted: int = 0
    rounds_by_block: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # len -> rounds
    # len -> draft tokens judged (accepted and the first rejected) and accepted, over the rounds of that block length
    judged_by_block: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    accepted_by_block: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    draft_s: float = 0.0  # time in propose and update

    @property
    def rounds(self) -> int:
        return sum(self.rounds_by_block.values())

    @property
    def drafts(self) -> int:
        return self.rounds - self.rounds_by_block[0]

    @property
    def drafted(self) -> int:
        return sum(k * n for k, n in self.rounds_by_block.items())


def accept_greedy(block: list[int], target: list[int]) -> int:
    """Drafted tokens greedy verification keeps: the longest common prefix of block and target."""
    n = 0
    while n < len(block) and n < len(target) and block[n] == target[n]:
        n += 1
    return n


def greedy_round(sequence: DraftSequence, committed: int, rest: list[int], k: int,
                 cut: Callable[[int, int], int] = lambda num_tokens, num_chained: num_tokens - num_chained,
                 ) -> tuple[DraftBlock, int, list[int]]:
    """One round over a known greedy continuation: the draft's block for k (none for k = 0), cut to `cut(tokens,
    chained)` tokens (`SpeculationPolicy.cut_block`; by default, as at a fixed k, without chained tokens), how many
    of its tokens the target accepts, and what the round emits (those and the target's own token, from `rest`, the
    continuation after the `committed` tokens); the draft's sequence is brought to what was emitted."""
    block = sequence.propose(k) if k > 0 else DraftBlock.empty()
    block = block.cut(cut(len(block.token_ids), block.num_chained))
    matched = accept_greedy(block.token_ids, rest)
    emitted = rest[:matched + 1]
    sequence.update(committed + matched, emitted[matched:])
    return block, matched, emitted


def replay(runs: list[tuple[list[int], list[int]]], k: int, open_sequence: OpenSequence) -> ReplayStats:
    """Replay greedy speculation at block length k over (prompt ids, target continuation) pairs, in order."""
    stats = ReplayStats()
    for prompt_ids, continuation in runs:
        started = time.perf_counter()
        sequence = open_sequence(list(prompt_ids))
        stats.draft_s += time.perf_counter() - started
        pos, end = 0, len(continuation)
        while pos < end:
            started = time.perf_counter()
            block, matched, emitted = greedy_round(sequence, len(prompt_ids) + pos, continuation[pos:],
                                                   min(k, end - pos - 1))
            stats.draft_s += time.perf_counter() - started  # propose and update (and the microseconds of matching)
            n = len(block.token_ids)
            stats.rounds_by_block[n] += 1
            stats.judged_by_block[n] += matched + (matched < n)
            stats.accepted_by_block[n] += matched
            stats.accepted += matched
            stats.tokens += len(emitted)
            pos += len(emitted)
        sequence.finish()
        sequence.close()
    return stats


def speculative_greedy(model, prompt_ids: list[int], max_new_tokens: int, k: int, sequence: DraftSequence | None,
                       eos: set[int], stats: ReplayStats | None = None) -> list[int]:
    """Greedy decoding in rounds of one forward over [pending, *block] with a KV cache; k = 0: plain decoding."""
    import torch

    from specdec.modeling.kv_cache import new_cache, rollback_cache

    cache = new_cache(model)
    generated: list[int] = []
    done = False
    with torch.inference_mode():
        if len(prompt_ids) > 1:
            model(input_ids=torch.tensor([prompt_ids[:-1]]), past_key_values=cache, use_cache=True, logits_to_keep=1)
        pending = prompt_ids[-1]
        while not done:
            room = min(k, max_new_tokens - len(generated) - 1)
            draft = sequence.propose(room) if sequence is not None and room > 0 else DraftBlock.empty()
            block = draft.token_ids[:len(draft.token_ids) - draft.num_chained]  # at a fixed k, none chained
            committed = len(prompt_ids) + len(generated)  # the cache holds committed - 1 tokens (not `pending`)
            logits = model(input_ids=torch.tensor([[pending, *block]]), past_key_values=cache,
                           use_cache=True).logits[0]  # [len(block) + 1, vocab]
            targets = logits.argmax(dim=-1).tolist()
            matched = accept_greedy(block, targets)
            emitted = block[:matched] + [targets[matched]]
            rollback_cache(cache, committed + matched)
            if sequence is not None:
                sequence.update(committed + matched, emitted[matched:])
            if stats is not None:
                stats.rounds_by_block[len(block)] += 1
                stats.accepted += matched
                stats.tokens += len(emitted)
            for token in emitted:
                generated.append(token)
                done = token in eos or len(generated) >= max_new_tokens
                if done:
                    break
            pending = emitted[-1]
    if sequence is not None:
        sequence.finish()
        sequence.close()
    return generated
