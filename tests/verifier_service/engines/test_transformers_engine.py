"""The transformers engine: scoring, commit and rollback against fresh forward passes."""

import pytest
import torch

from specdec.modeling.models import load_causal_lm
from verifier_service.engines.transformers_engine import TransformersEngine


@pytest.fixture(scope="module")
def engine(tiny_pair):
    return TransformersEngine(load_causal_lm(str(tiny_pair[0])))


def fresh_logits(model, tokens):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([tokens])).logits[0, -1].float()  # [V]


def test_score_gives_one_row_per_draft_plus_bonus(engine):
    state = engine.start([5, 6, 7])
    logits = engine.score(state, [8, 9, 10])
    assert logits.shape == (4, engine.vocab_size)
    torch.testing.assert_close(logits[0], fresh_logits(engine.model, [5, 6, 7]), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logits[3], fresh_logits(engine.model, [5, 6, 7, 8, 9, 10]), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("num_accepted", [0, 1, 3])
def test_rollback_after_rejection_matches_a_fresh_forward_pass(engine, num_accepted):
    state = engine.start([5, 6, 7, 11])
    draft = [8, 9, 10]
    engine.score(state, draft)
    emitted = draft[:num_accepted] + [42]  # the correction (or bonus) token
    engine.commit(state, num_accepted, emitted)
    assert state.cached_length == len(state.tokens) - 1 == state.cache.get_seq_length()
    # the next round's first row must equal a fresh pass over the accepted sequence
    after = engine.score(state, [])
    torch.testing.assert_close(after[0], fresh_logits(engine.model, state.tokens), rtol=1e-4, atol=1e-4)


def test_one_token_prompt_needs_no_prefill(engine):
    state = engine.start([3])
    assert state.cached_length == 0
    torch.testing.assert_close(engine.score(state, [])[0], fresh_logits(engine.model, [3]), rtol=1e-4, atol=1e-4)


def logits_rows(model) -> tuple[list[int], object]:
    """Rows of logits each forward of `model` returns, recorded by a hook (remove the handle after)."""
    rows = []
    return rows, model.register_forward_hook(lambda module, args, out: rows.append(out.logits.shape[1]))


def test_prefill_runs_the_head_on_the_last_position_only(tiny_pair):
    engine = TransformersEngine(load_causal_lm(str(tiny_pair[0])), prefill_chunk_tokens=4)
    rows, handle = logits_rows(engine.model)
    try:
        state = engine.start(list(range(3, 14)))  # 10 tokens to prefill: chunks of 4, 4 and 2
        assert rows == [1, 1, 1]
        logits = engine.score(state, [8, 9])  # a block's rows are all read
    finally:
        handle.remove()
    assert rows[-1] == 3
    torch.testing.assert_close(logits[0], fresh_logits(engine.model, list(range(3, 14))), rtol=1e-4, atol=1e-4)


def seeded_run(engine, prompt, blocks, steps=24, seed=1234):
    """Tokens of a seeded T=0.9 sequence, verifying the block `blocks(tokens, round)` proposes each round."""
    from specdec.decoding.draft_block import DraftBlock
    from specdec.decoding.sampling import SamplingParams, make_generator
    from verifier_service.engines.transformers_engine import verify_block

    params = SamplingParams(temperature=0.9, seed=seed)
    state = engine.start(prompt)
    for i in range(steps):
        verdict, _ = verify_block(engine, state, DraftBlock(blocks(state.tokens, i)), params, make_generator(None))
    return state.tokens[len(prompt):]


def test_a_seeded_sequence_does_not_depend_on_the_drafts_or_the_blocks(engine):
    """Keyed draws and the coupled rule: plain decoding, random drafts of varying length and a perfect draft
    emit the same tokens for the same seed (the old per-request stream followed the blocks)."""
    prompt = [5, 6, 7]
    plain = seeded_run(engine, prompt, lambda tokens, i: [], steps=24)
    rng = torch.Generator().manual_seed(0)
    noisy = seeded_run(engine, prompt, lambda tokens, i: torch.randint(0, engine.vocab_size, (i % 5,),
                                                                       generator=rng).tolist(), steps=24)
    perfect = seeded_run(engine, prompt, lambda tokens, i: plain[len(tokens) - len(prompt):][:4], steps=8)
    n = min(len(plain), len(noisy), len(perfect))
    assert n >= 24 and plain[:n] == noisy[:n] == perfect[:n]
    assert len(perfect) > 8  # the perfect draft was accepted: fewer rounds, as many tokens
    assert seeded_run(engine, prompt, lambda tokens, i: [], steps=24, seed=1235) != plain  # the seed matters
