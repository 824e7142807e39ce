"""The advisor's in-process check of the model draft: HF assisted generation at the k it was asked for."""

import pytest

from bench.replay.advise import Prompt, hf_assisted_speedup
from specdec.modeling.models import load_causal_lm, load_tokenizer


@pytest.mark.parametrize("k", [1, 3])
def test_assisted_generation_verifies_blocks_of_the_asked_k(tiny_pair, k):
    target, draft = (load_causal_lm(str(path), dtype="float32") for path in tiny_pair)
    rows = []  # the tokens of each target forward: the prompt, then k drafts and the pending token a round
    handle = target.register_forward_hook(lambda module, args, kwargs, out: rows.append(kwargs["input_ids"].shape[1]),
                                          with_kwargs=True)
    default_k = draft.generation_config.num_assistant_tokens
    prompt = Prompt("custom", "p0", "Invoice 7 from Ada, Paris.", 12, position=0)
    try:
        assert hf_assisted_speedup(target, draft, load_tokenizer(str(tiny_pair[0])), [prompt], k, eos=2,
                                   repeats=1) > 0
    finally:
        handle.remove()
    rounds = rows[rows.index(max(rows)) + 1:]  # after the assisted run's first forward (its prompt)
    assert rounds and max(rounds) == k + 1 and set(rounds) <= set(range(1, k + 2))
    assert draft.generation_config.num_assistant_tokens == default_k  # the draft's own config is restored


def test_step_ratio_of_a_model_against_itself_is_about_one(tiny_pair):
    from bench.replay.advise import step_ratio

    target = load_causal_lm(str(tiny_pair[0]), dtype="float32")
    assert 0.5 < step_ratio(target, target, context=32) < 2.0


def test_the_hybrids_model_cost_is_spread_over_the_tokens_its_blocks_held():
    from bench.replay.advise import hybrid_cost_per_token

    # 96 model tokens among 141 tokens in blocks: the suffix side's 154 proposed (chained included) do not dilute it
    assert hybrid_cost_per_token(0.45, 96, 141) == pytest.approx(0.45 * 96 / 141)
    assert hybrid_cost_per_token(0.45, 0, 50) == 0.0 and hybrid_cost_per_token(0.45, 0, 0) == 0.0
    assert hybrid_cost_per_token(0.45, 10, 8) == 0.45  # never more than a model block's own cost
