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
        return self.window(0, n)

    def window(self, offset: int, n: int) -> DraftBlock:
        """Tokens offset .. offset + n (and their q), with the chained ones among them (the block's last)."""
        if offset == 0 and n >= len(self.token_ids):
            return self
        end = min(len(self.token_ids), offset + n)
        chained = max(0, end - max(offset, len(self.token_ids) - self.num_chained))
        return DraftBlock(self.token_ids[offset:end], None if self.probs is None else self.probs[offset:end],
                          self.ahead, chained)
