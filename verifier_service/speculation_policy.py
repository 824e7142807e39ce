"""How many tokens to draft this round (k)."""

from __future__ import annotations


class SpeculationPolicy:
    """Chooses k per round: the request's k, or the server default; never past the request's end."""

    def __init__(self, default_k: int, max_k: int):
        self.default_k = default_k
        self.max_k = max_k

    def block_size(self, requested_k: int | None, remaining_tokens: int, remaining_context: int) -> int:
        k = self.default_k if requested_k is None else requested_k
        # A round emits k + 1 tokens at most: keep it within max_tokens and the context.
        return max(0, min(k, self.max_k, remaining_tokens - 1, remaining_context - 1))

    def observe(self, num_draft_tokens: int, num_accepted: int) -> None:
        """Learn from a verified round (used by adaptive policies)."""
