"""The reference engine: a transformers causal LM with one KV cache per sequence.

Sequence state is a position over a cache. Invariant: the cache holds K/V for
tokens[:cached_length], and cached_length == len(tokens) - 1, so exactly one
token (the last one emitted) is pending. A round feeds [pending, d_1..d_k] in one
forward pass, which yields the target's logits after the prefix and after each
draft token (k + 1 rows). Rollback is an explicit crop back to the accepted
length; nothing is recomputed.
"""

from __future__ import annotations

import dataclasses

import torch

from specdec import models
from specdec.kv_cache import new_cache, rollback_cache


@dataclasses.dataclass
class SequenceState:
    """One live sequence: its tokens and its KV cache."""

    tokens: list[int]  # prompt + completion so far
    cache: object  # transformers DynamicCache holding K/V for tokens[:cached_length]
    cached_length: int  # the position: tokens whose K/V are in the cache

    @property
    def pending(self) -> int:
        return self.tokens[-1]


class TransformersEngine:
    """Scores draft blocks with a transformers model, on CPU or CUDA."""

    name = "transformers"

    def __init__(self, model, device: str = "cpu"):
        self.model = model
        self.device = torch.device(device)
        self.vocab_size = int(model.config.vocab_size)
        self.max_context = models.max_context(model)

    def start(self, prompt_ids: list[int]) -> SequenceState:
        """Prefill every prompt token but the last, which becomes the pending token."""
        state = SequenceState(list(prompt_ids), new_cache(self.model), 0)
        if len(prompt_ids) > 1:
            self._forward(state, prompt_ids[:-1])
        state.cached_length = len(prompt_ids) - 1
        return state

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

    @torch.inference_mode()
    def _forward(self, state: SequenceState, token_ids: list[int]) -> torch.Tensor:
        """Run token_ids after the cached prefix. Returns logits [len(token_ids), V]."""
        input_ids = torch.tensor([token_ids], dtype=torch.long, device=self.device)  # [1, n]
        out = self.model(input_ids=input_ids, past_key_values=state.cache, use_cache=True)
        return out.logits[0]  # [n, V]
