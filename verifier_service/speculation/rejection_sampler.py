"""Accept or reject a block of draft tokens: the rules of speculative decoding.

Three rules: `greedy_verify` (temperature 0), `rejection_sample` (exact speculative
sampling, for requests without a seed) and `drafter_invariant_sample` (Gumbel-max
coupling keyed by (seed, position), for seeded requests: its output depends on the
seed alone, not on the draft).

Glossary (as in vLLM's rejection sampler and Leviathan et al. 2023,
arXiv 2211.17192; Chen et al. 2023, arXiv 2302.01318):

- draft tokens: the k tokens x_1..x_k proposed by the draft, drawn from q.
- accepted tokens: the longest prefix of the draft kept by the verifier.
- recovered token: on the first rejection at position i, a token drawn from
  the residual distribution norm(max(0, p_i - q_i)); it replaces x_i.
- bonus token: when all k drafts are accepted, one more token drawn from
  p_{k+1}, which the same forward pass has already computed.

Every round therefore emits num_accepted + 1 tokens. The output is distributed
exactly as the target's p: token x_i is accepted with probability
min(1, p_i(x_i) / q_i(x_i)).

Drafter-invariant speculative decoding (Daliri, Musco, Suresh 2024, "Coupling
without communication and drafter-invariant speculative decoding", arXiv 2408.07978):

- keyed draw: the target's token at absolute position n (an index into prompt +
  completion) is y_n = argmax_v(log p_n(v) + g_n(v)), with Gumbel noise g_n fixed
  by (seed, n) alone (specdec.decoding.sampling.keyed_sample). Over seeds y_n ~ p_n.
- coupled acceptance: draft token x_i is accepted iff x_i == y_i. At the first
  mismatch y_i is emitted (the recovered token); after k acceptances the bonus
  token is y_{k+1}.

The emitted sequence is therefore exactly the seeded plain sample sequence y,
whatever the draft proposed and however blocks were cut. For a deterministic
draft (one-hot q) x_i is accepted with probability p_i(x_i), as under rejection
sampling; a sampled model draft that draws x_i with the same keyed noise from q
is accepted with probability at least (1 - d) / (1 + d), d = TV(p, q), against
1 - d for rejection sampling with an independent draft.

Pure functions: no gRPC, no I/O, no model.
"""

from __future__ import annotations

import dataclasses

import torch

from specdec.decoding.sampling import keyed_sample, sample


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What one round decided."""

    num_accepted: int  # accepted draft tokens, 0..k
    next_token: int  # the recovered token (if num_accepted < k) or the bonus token

    def emitted(self, draft_token_ids: list[int]) -> list[int]:
        """The tokens this round adds to the sequence."""
        return list(draft_token_ids[: self.num_accepted]) + [self.next_token]


def greedy_verify(draft_token_ids: list[int], target_argmax: list[int]) -> Verdict:
    """Greedy fast path: accept the longest prefix that matches the target's argmax.

    draft_token_ids: [k]; target_argmax: [k + 1], the target's argmax after the
    prefix and after each draft token.
    """
    num_accepted = 0
    for drafted, wanted in zip(draft_token_ids, target_argmax):
        if drafted != wanted:
            break
        num_accepted += 1
    return Verdict(num_accepted, int(target_argmax[num_accepted]))


def rejection_sample(
    draft_token_ids: list[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> Verdict:
    """Exact speculative sampling.

    draft_token_ids: [k] tokens drawn from q.
    draft_probs: [k, V] the draft's shaped distribution q, or None for a
        deterministic proposer (n-gram), whose q is one-hot on each token.
    target_probs: [k + 1, V] the target's shaped distribution p at each draft
        position, plus the bonus position.
    """
    k = len(draft_token_ids)
    if k:
        positions = torch.arange(k)
        drafted = torch.tensor(draft_token_ids, dtype=torch.long)
        p_x = target_probs[positions, drafted]  # [k]
        q_x = torch.ones(k) if draft_probs is None else draft_probs[positions, drafted]  # [k]
        uniform = torch.rand(k, generator=generator)  # [k]
        # accept x with probability min(1, p(x) / q(x)), written without division
        accepted = uniform * q_x < p_x  # [k]
        rejected = (~accepted).nonzero()
        if len(rejected):
            i = int(rejected[0])
            return Verdict(i, sample(recovered_distribution(target_probs[i], draft_probs, i, drafted[i]), generator))
    return Verdict(k, sample(target_probs[k], generator))


def drafter_invariant_sample(
    draft_token_ids: list[int],
    target_probs: torch.Tensor,
    seed: int,
    first_position: int,
) -> Verdict:
    """Coupled acceptance with keyed draws (drafter-invariant speculative decoding): exact for any draft.

    draft_token_ids: [k] proposed tokens; how they were chosen does not matter (q is not needed).
    target_probs: [k + 1, V] the target's shaped distribution at each draft position, plus the bonus position.
    seed: the request's seed; first_position: the absolute position of draft_token_ids[0] (and of row 0).
    Draws only up to the first mismatch.
    """
    for i, drafted in enumerate(draft_token_ids):
        wanted = keyed_sample(target_probs[i], seed, first_position + i)
        if drafted != wanted:
            return Verdict(i, wanted)
    k = len(draft_token_ids)
    return Verdict(k, keyed_sample(target_probs[k], seed, first_position + k))


def recovered_distribution(
    p: torch.Tensor, draft_probs: torch.Tensor | None, position: int, drafted: torch.Tensor
) -> torch.Tensor:
    """norm(max(0, p - q)) at the first rejected position. p: [V]. Returns [V]."""
    if draft_probs is None:
        residual = p.clone()
        residual[drafted] = 0.0  # q is one-hot on the drafted token
    else:
        residual = torch.clamp(p - draft_probs[position], min=0.0)
    total = residual.sum()
    # p == q exactly leaves no residual; then a rejection has probability 0, and
    # p itself is the right fallback for rounding noise.
    return residual / total if total > 0 else p
