"""A block of draft tokens: what the draft proposes and the verifier checks, on both sides of the wire.

On the wire it is a `ProposeResponse` (token ids, and q as little-endian float32 bytes).
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class DraftBlock:
    token_ids: list[int]  # [k'] proposed tokens, k' <= the k asked for (a proposer may find fewer, or none)
    probs: torch.Tensor | None = None  # [k', V] the draft distribution q; None means one-hot (deterministic)
    ahead: bool = False  # drafted ahead, while the previous round was verified (pipelined drafting)
    num_chained: int = 0  # tokens chained past the draft's match (suffix decoding), before the forced ones; the verifier may cut them
    num_forced: int = 0  # the last tokens were forced by the request's grammar (the draft's grammar tail)
    sized_by_draft: bool = False  # as long as the draft's evidence went, not as long as asked (the hybrid's suffix side)

    @classmethod
    def empty(cls) -> DraftBlock:
        """No draft this round: the verifier decodes one plain step."""
        return cls([], None)

    def cut(self, n: int) -> DraftBlock:
        """The first n tokens (and their q); chained and forced tokens are the last, so they go first."""
        return self.window(0, n)

    def window(self, offset: int, n: int) -> DraftBlock:
        """Tokens offset .. offset + n (and their q), with the chained and forced ones among them. The block is laid
        out [matched][chained][forced]: the last num_forced tokens, the num_chained before them."""
        if offset == 0 and n >= len(self.token_ids):
            return self
        end = min(len(self.token_ids), offset + n)
        forced_from = len(self.token_ids) - self.num_forced
        chained_from = forced_from - self.num_chained
        forced = max(0, end - max(offset, forced_from))
        chained = max(0, min(end, forced_from) - max(offset, chained_from))
        return DraftBlock(self.token_ids[offset:end], None if self.probs is None else self.probs[offset:end],
                          self.ahead, chained, forced, self.sized_by_draft)
