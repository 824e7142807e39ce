"""A small causal LM as the draft, with its own KV cache and explicit rollback.

The cache holds K/V for tokens[:cached_length]; the tokens after that are fed
on the next proposal, so the prefix is never re-encoded.

A seeded request's draft tokens are drawn with the noise the verifier keys by (seed,
position) (Gumbel coupling): where q is close to p the draft proposes the very token
the target will draw, which the verifier's coupled rule accepts. An unseeded request's
draft tokens come from the draft's own random stream, as rejection sampling needs.
"""

from __future__ import annotations

import torch

from specdec.decoding.draft_block import DraftBlock
from draft_service.proposer import DraftSequence, Proposer
from specdec.decoding.sampling import SamplingParams, keyed_sample, make_generator, probs_from_logits, sample
from specdec.modeling.kv_cache import new_cache, rollback_cache


class ModelSequence(DraftSequence):
    def __init__(self, model, prompt_ids: list[int], sampling: SamplingParams, return_probs: bool):
        self.model = model
        self.sampling = sampling
        self.return_probs = return_probs and not sampling.greedy
        self.generator = make_generator(None)  # unseeded requests' own stream; seeded ones draw keyed by position
        self.cache = new_cache(model)
        self.cached_length = 0
        super().__init__(prompt_ids)

    @torch.inference_mode()
    def propose(self, k: int) -> DraftBlock:
        proposal, rows = [], []
        for _ in range(k):
            logits = self._feed(self.tokens[self.cached_length :])  # [V] after the last token
            # Drawn on the CPU, where the generator and the keyed noise live (q may travel to the verifier).
            q = probs_from_logits(logits[None], self.sampling)[0].float().cpu()  # [V]
            token = self._draw(q)
            self.tokens.append(token)
            proposal.append(token)
            rows.append(q)
        probs = torch.stack(rows) if (self.return_probs and rows) else None  # [k, V]
        return DraftBlock(proposal, probs)

    def _draw(self, q: torch.Tensor) -> int:
        """The draft token at position len(tokens). q: [V]."""
        if self.sampling.greedy:
            return int(q.argmax())
        if self.sampling.seed is not None:
            return keyed_sample(q, self.sampling.seed, len(self.tokens))
        return sample(q, self.generator)

    def _feed(self, token_ids: list[int]) -> torch.Tensor:
        """Put token_ids into the cache; the logits after the last one. The head runs on that position alone
        (logits_to_keep): the prompt's reading and a catch-up over adopted tokens read no other position's logits."""
        input_ids = torch.tensor([token_ids], dtype=torch.long, device=self.model.device)  # [1, n]
        out = self.model(input_ids=input_ids, past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        self.cached_length += len(token_ids)
        return out.logits[0, -1]  # [V]

    def _extend(self, token_ids: list[int]) -> None:
        self.tokens.extend(token_ids)

    def _truncate(self, length: int) -> None:
        del self.tokens[length:]
        # keep at least one token uncached, so that the next proposal has something to feed
        if self.cached_length > length - 1:
            self.cached_length = max(length - 1, 0)
            rollback_cache(self.cache, self.cached_length)

    def close(self) -> None:
        self.cache = None


class ModelProposer(Proposer):
    method = "model"
    inline = False

    def __init__(self, model):
        self.model = model

    def start(self, prompt_ids: list[int], sampling: SamplingParams, return_probs: bool,
              tenant: str = "") -> ModelSequence:
        return ModelSequence(self.model, prompt_ids, sampling, return_probs)
