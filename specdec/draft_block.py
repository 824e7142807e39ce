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
    num_chained: int = 0  # the last tokens were chained past the draft's match (suffix decoding); the verifier may cut them

    @classmethod
    def empty(cls) -> DraftBlock:
        """No draft this round: the verifier decodes one plain step."""
        return cls([], None)

    def cut(self, n: int) -> DraftBlock:
        """The first n tokens (and their q); chained tokens are the last, so they go first."""
        if n >= len(self.token_ids):
            return self
        return DraftBlock(self.token_ids[:n], None if self.probs is None else self.probs[:n], self.ahead,
                          max(0, self.num_chained - (len(self.token_ids) - n)))
