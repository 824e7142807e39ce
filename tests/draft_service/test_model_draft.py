"""The model draft: its KV cache after rollback equals a fresh pass; it never re-encodes the prefix."""

import pytest
import torch

from draft_service.model_draft import ModelProposer
from specdec.modeling.models import load_causal_lm
from specdec.decoding.sampling import SamplingParams


@pytest.fixture(scope="module")
def proposer(tiny_pair):
    return ModelProposer(load_causal_lm(str(tiny_pair[1])))


def fresh_next_logits(model, tokens):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([tokens])).logits[0, -1]


@pytest.mark.parametrize("keep", [0, 2, 4])
def test_rollback_then_propose_matches_a_fresh_forward_pass(proposer, keep):
    prompt = [5, 6, 7, 8]
    seq = proposer.start(prompt, SamplingParams(), return_probs=False)
    block = seq.propose(4).token_ids
    seq.update(len(prompt) + keep, [42])  # kept `keep` drafts, then the target's token
    assert seq.tokens == prompt + block[:keep] + [42]
    logits = seq._feed(seq.tokens[seq.cached_length :])
    torch.testing.assert_close(logits, fresh_next_logits(proposer.model, seq.tokens), rtol=1e-4, atol=1e-4)


def test_each_round_feeds_only_the_new_tokens(proposer, monkeypatch):
    seq = proposer.start(list(range(1, 40)), SamplingParams(), return_probs=False)
    fed = []
    original = seq._feed
    monkeypatch.setattr(seq, "_feed", lambda ids: fed.append(len(ids)) or original(ids))
    seq.propose(3)
    seq.update(len(seq.tokens) - 1, [7])
    seq.propose(3)
    assert fed[0] == 39  # the prompt, once
    assert max(fed[1:]) <= 2  # afterwards only the target's token (and one uncached draft)


def test_sampling_returns_q_rows_that_sum_to_one(proposer):
    seq = proposer.start([1, 2, 3], SamplingParams(temperature=0.8, top_k=5, seed=1), return_probs=True)
    proposal = seq.propose(3)
    assert proposal.probs.shape == (3, proposer.model.config.vocab_size)
    torch.testing.assert_close(proposal.probs.sum(-1), torch.ones(3))
    for token, row in zip(proposal.token_ids, proposal.probs):
        assert row[token] > 0 and (row > 0).sum() <= 5


def test_a_seeded_draft_samples_with_the_verifiers_keyed_noise(tiny_pair):
    """Gumbel coupling: a draft sampling q with the noise keyed by (seed, position) proposes the target's own
    keyed draw where q == p, so a draft that is the target itself is accepted whole by the coupled rule."""
    from specdec.decoding.draft_block import DraftBlock
    from specdec.decoding.sampling import make_generator
    from verifier_service.engines.transformers_engine import TransformersEngine, verify_block

    target = load_causal_lm(str(tiny_pair[0]))
    engine, proposer = TransformersEngine(target), ModelProposer(target)
    prompt, accepted = [5, 6, 7], 0
    for seed in range(10):
        params = SamplingParams(temperature=0.9, seed=seed)
        block = proposer.start(prompt, params, return_probs=False).propose(4)
        assert block.probs is None  # the coupled rule needs no q
        verdict, _ = verify_block(engine, engine.start(prompt), DraftBlock(block.token_ids), params, make_generator(None))
        accepted += verdict.num_accepted
    assert accepted == 40


def test_the_prompt_read_runs_the_head_on_the_last_position_only(proposer):
    rows = []
    handle = proposer.model.register_forward_hook(lambda module, args, out: rows.append(out.logits.shape[1]))
    try:
        seq = proposer.start(list(range(1, 40)), SamplingParams(), return_probs=False)
        seq.propose(2)  # the 39 prompt tokens in one forward, then the first draft token
    finally:
        handle.remove()
    assert rows == [1, 1]
