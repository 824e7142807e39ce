"""The hybrid draft: suffix decoding where it matches, the draft model everywhere else.

vLLM and Arctic make a deployment choose one method: a model draft, which drafts well everywhere at the cost of a
forward per token, or suffix decoding / n-gram lookup, which costs nothing and drafts long blocks where the output
copies its input or earlier outputs (code edits, JSON), and nothing useful elsewhere. An oracle that takes the
better of n-gram and EAGLE per step reached 4.9x on code editing (arXiv 2601.11580). This is a simple, causal rule
in that direction, composed of the two proposers as they are:

- Each block comes from one side only. The suffix side is asked first, for as many tokens as its evidence goes (up to
  the draft's --max-speculative-tokens); if it drafted at least the round's threshold of tokens on its match (chained
  tokens not counted), its block is the answer; otherwise the suffix's tokens are retracted and the model drafts k.
  The threshold is --hybrid-min-suffix, by default 1: any match answers, and the model drafts only where the suffix
  side has nothing. A suffix block costs no forward, verifying a longer block costs little more than a plain step, and
  the tokens the suffix chains past its match are often right where the output copies: measured on the Qwen2.5-Coder
  pair, a threshold of 4 (a match of 4 tokens or more) handed rounds to the model that the suffix side won
  (docs/design.md). The verifier may send its own threshold (NextBlock.min_sized, with its --hybrid-threshold priced:
  `SpeculationPolicy.min_sized`): the shortest match whose block, at the acceptance the verifier has measured for
  matches that long and at the target's forward time alone, emits more tokens per second than the model's block of k
  at its measured cost.
- A suffix block is not cut to k: it says it was sized by its evidence (`DraftBlock.sized_by_draft`), and the
  verifier verifies it only as far as its tokens pay, as it does every block of the suffix draft alone, and does not
  time the draft's pace on it (it took no forward). The verifier's k prices the model side, whose
  block costs a forward per token; cut to that k, a suffix block on a refactor would bring one or two tokens a round
  where the suffix draft alone brings six.
- Probabilities stay exact: a suffix block carries no q (one-hot, deterministic), a model block carries the model's
  q, and the verifier judges each block by its own q. Which side answers depends only on the context (the prompt and
  the target's tokens), never on a draft's random draw.
- Both sides see every sync (`update`, `confirm`), and each adopts the other's proposal as if it had proposed it
  (`DraftSequence.adopt`), so their sequences are always the same tokens: the suffix tree indexes what the target
  verified whatever side drafted it, and the model's next proposal starts at the right position.
- The model's KV cache is extended lazily: adopting a suffix block only appends token ids, and the next model
  proposal feeds everything its cache lacks in one forward (as a model draft feeds the target's token each round).
  Rounds the suffix answers cost no model forward at all; the first model round after a run of them pays one
  prefill-like forward over the tokens of that run, far cheaper than one forward per token. The prompt is read
  the same way, when the model first drafts: a request whose suffix side answers every round never pays the
  model's prompt read. The verifier treats its asks as a stream's opening until the model has answered one (its
  longer wait, then plain steps until the answer comes), so the round that has the model read the prompt does not
  time out; and it asks the model for the first time only where its blocks would save more than that read over
  the rest of the request (`SpeculationPolicy.model_read_pays`), else the suffix side alone.

The verifier chooses k (`sizes_blocks` is False): the model side's cost grows with k, and the verifier's adaptive k
weighs it (the draft's measured pace). The two sides are priced apart: a suffix block's time and acceptance are not
the model's, so they do not enter what sizes k (`SpeculationPolicy.observe`'s sized); and where the model's blocks
do not pay, the verifier still asks for the suffix side's alone (`sizes_some_blocks`, NextBlock.sized_only:
`HybridSequence.propose_sized`), which costs the model nothing, so the hybrid falls back to suffix decoding rather
than to no draft at all.
"""

from __future__ import annotations

import dataclasses

from draft_service.proposer import DraftSequence, Proposer
from specdec.decoding.draft_block import DraftBlock
from specdec.decoding.sampling import SamplingParams
from specdec.runtime import metrics
from specdec.runtime.config import option

SOURCES = ("suffix", "model")


@dataclasses.dataclass(frozen=True)
class HybridConfig:
    """Hybrid draft (--method hybrid: suffix decoding where it matches, the draft model otherwise)"""

    hybrid_min_suffix: int = option(1, "the suffix side answers a round when it drafts at least this many tokens on "
                                       "its match (it drafts at most one per matched token, while the continuation "
                                       "stays likely); else the draft model drafts the block. 1: any match. Used "
                                       "where the verifier sends no threshold of its own (--hybrid-threshold priced)")

    def __post_init__(self):
        if self.hybrid_min_suffix < 1:
            raise ValueError(f"--hybrid-min-suffix must be at least 1, got {self.hybrid_min_suffix}")


class HybridSequence(DraftSequence):
    """Two sequences of the same tokens, `suffix` and `model`; each block from one of them (module docstring)."""

    def __init__(self, suffix: DraftSequence, model: DraftSequence, min_suffix: int, longest: int = 0):
        self.suffix, self.model, self.min_suffix = suffix, model, min_suffix
        self.longest = longest  # the longest block the suffix side may size by its evidence (0: k)
        self.asked_min = 0  # the verifier's threshold for the suffix side (NextBlock.min_sized; 0: min_suffix)

    @property
    def tokens(self) -> list[int]:
        return self.suffix.tokens

    def update(self, keep_length: int, append_token_ids: list[int], assumed: bool = False) -> None:
        self.suffix.update(keep_length, append_token_ids, assumed)
        self.model.update(keep_length, append_token_ids, assumed)

    def confirm(self, length: int) -> None:
        self.suffix.confirm(length)
        self.model.confirm(length)

    def propose(self, k: int) -> DraftBlock:
        if k <= 0:
            return DraftBlock.empty()
        block = self._suffix_block(k)
        if block is None:
            block = self.model.propose(k)
            self.suffix.adopt(block.token_ids)
            self.source = "model"
        metrics.HYBRID_BLOCKS.labels(source=self.source).inc()
        return block

    def propose_sized(self, k: int) -> DraftBlock:
        """The suffix side's block where it would answer, else none: the model is not asked (the verifier found its
        blocks do not pay), nor does it read anything."""
        block = self._suffix_block(k) if k > 0 else None
        if block is None:
            return DraftBlock.empty()
        metrics.HYBRID_BLOCKS.labels(source=self.source).inc()
        return block

    def set_min_sized(self, length: int) -> None:
        self.asked_min = length

    def _suffix_block(self, k: int) -> DraftBlock | None:
        """The suffix side's block if it drafts at least the verifier's threshold (else min_suffix) tokens on its
        match (adopted by the model side), else None, the suffix's tokens retracted."""
        start = len(self.tokens)
        threshold = self.asked_min or self.min_suffix
        block = self.suffix.propose(max(k, threshold, self.longest))
        if len(block.token_ids) - block.num_chained < threshold:
            self.suffix.retract(start)
            return None
        block = dataclasses.replace(block.cut(max(k, self.longest)), sized_by_draft=True)
        self.suffix.retract(start + len(block.token_ids))
        self.model.adopt(block.token_ids)  # token ids only: its KV catches up when it next drafts
        self.source = "suffix"
        return block

    def _truncate(self, length: int) -> None:
        self.suffix.retract(length)
        self.model.retract(length)

    def _extend(self, token_ids: list[int]) -> None:
        self.suffix.adopt(token_ids)
        self.model.adopt(token_ids)

    def finish(self) -> None:
        self.suffix.finish()
        self.model.finish()

    def close(self) -> None:
        self.suffix.close()
        self.model.close()


class HybridProposer(Proposer):
    method = "hybrid"
    inline = False  # the model side runs a forward: on the compute thread (the suffix cache takes a lock)
    sizes_blocks = False  # the verifier's k bounds the model's cost (module docstring)
    sizes_some_blocks = True  # the suffix side's: asked alone (NextBlock.sized_only) where the model's do not pay

    def __init__(self, suffix: Proposer, model: Proposer, min_suffix: int = HybridConfig.hybrid_min_suffix,
                 longest: int = 0):
        self.suffix, self.model, self.min_suffix = suffix, model, min_suffix
        self.longest = longest  # --max-speculative-tokens: a suffix block may be this long (0: no longer than k)

    def start(self, prompt_ids: list[int], sampling: SamplingParams, return_probs: bool,
              tenant: str = "") -> HybridSequence:
        return HybridSequence(self.suffix.start(prompt_ids, sampling, return_probs, tenant),
                              self.model.start(prompt_ids, sampling, return_probs, tenant), self.min_suffix,
                              self.longest)
