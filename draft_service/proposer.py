"""The proposer contract: propose k tokens with their probabilities, then learn what was kept.

A proposer makes one `DraftSequence` per live sequence. The verifier talks to it
in rounds: `update(keep_length, append)` rolls the sequence back to what the
target accepted and appends the target's token(s); `propose(k)` returns the next
block. Proposed tokens become part of the draft's sequence until an update
rolls them back, so a fully accepted block costs nothing to keep.
"""

from __future__ import annotations

import abc


from specdec.decoding.draft_block import DraftBlock
from specdec.decoding.sampling import SamplingParams


class ProposerError(ValueError):
    """A request the proposer cannot honour; the message says why."""


class DraftSequence(abc.ABC):
    """One sequence's draft state. `tokens` is the prompt, the accepted tokens and the last proposal."""

    source = ""  # a proposer made of others (hybrid): the one that drafted the last block (a span attribute)

    def __init__(self, prompt_ids: list[int]):
        self.tokens: list[int] = []
        self._extend(list(prompt_ids))

    def update(self, keep_length: int, append_token_ids: list[int], assumed: bool = False) -> None:
        """Roll back to keep_length tokens (explicit), then append the target's tokens.

        assumed: the sync is the draft's own guess of the verifier's next one (drafting ahead: the last block
        accepted whole, and the draft's guess of the target's token), so a later update may roll back below
        it. `confirm` says when the verifier's real sync turned out the same."""
        if keep_length > len(self.tokens):
            raise ProposerError(f"keep_length {keep_length} is past the draft's sequence length {len(self.tokens)}")
        if keep_length < len(self.tokens):
            self._truncate(keep_length)
        if append_token_ids:
            self._extend(list(append_token_ids))

    def confirm(self, length: int) -> None:
        """The verifier's sync matched the assumed one: tokens[:length] are the prompt and the target's tokens."""

    def adopt(self, token_ids: list[int]) -> None:
        """Append a block another proposer drafted for this sequence, as if this one had proposed it: unverified,
        so the next update rolls it back unless the verifier keeps it (the hybrid draft keeps its sides in step)."""
        if token_ids:
            self._extend(list(token_ids))

    def retract(self, length: int) -> None:
        """Drop the proposed tokens past `length`, as the next update would, and sync nothing (the hybrid draft
        drops the block of the side it did not choose)."""
        if length < len(self.tokens):
            self._truncate(length)

    @abc.abstractmethod
    def propose(self, k: int) -> DraftBlock:
        """Propose up to k tokens after `tokens`, and append them to it."""

    def propose_sized(self, k: int) -> DraftBlock:
        """A block sized by the proposer's evidence at no model forward's cost, or none (NextBlock.sized_only): only
        a proposer that sizes some of its blocks so (`Proposer.sizes_some_blocks`: the hybrid) has one."""
        return DraftBlock.empty()

    def set_min_sized(self, length: int) -> None:
        """The shortest match at which a block sized by its evidence answers rather than a model's block
        (NextBlock.min_sized, the verifier's price of both; 0: the proposer's own rule), kept for the proposals after
        it. Only a proposer that sizes some of its blocks (the hybrid) reads it."""

    @abc.abstractmethod
    def _truncate(self, length: int) -> None:
        """Drop tokens[length:] and any state derived from them."""

    @abc.abstractmethod
    def _extend(self, token_ids: list[int]) -> None:
        """Append tokens (and index or cache them as the proposer needs)."""

    def finish(self) -> None:
        """The sequence ended normally (its stream was half-closed); `close` follows. A proposer that
        learns from finished outputs (suffix) keeps what the target generated; a cancelled or failed
        sequence gets only `close`."""

    def close(self) -> None:
        """Free what the sequence holds."""


class Proposer(abc.ABC):
    """Makes DraftSequences. `inline` proposers are cheap enough to run on the event loop."""

    method: str
    inline: bool = False
    # Sizes its own blocks: returns fewer tokens than asked, or none, where its evidence is weak, so the
    # verifier asks it for its longest block whenever drafting pays (GetDraftInfoResponse.sizes_blocks).
    sizes_blocks: bool = False
    # Sizes some of its blocks so, at no model forward's cost, and drafts the others with its model (the hybrid):
    # the verifier may ask for the first kind alone (`DraftSequence.propose_sized`) where the model's do not pay.
    sizes_some_blocks: bool = False
    # Takes the request's constraint: `start(..., constraint=, output_start=, request_id=)` (the grammar draft)
    takes_constraints: bool = False

    @abc.abstractmethod
    def start(self, prompt_ids: list[int], sampling: SamplingParams, return_probs: bool,
              tenant: str = "") -> DraftSequence:
        """Open a sequence for the prompt. `tenant` is an opaque id for proposers that keep per-tenant state."""
