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
    # a millisecond step under another worker's load: each pair's ratio is 1, or far off where one side was
    # preempted; with 31 pairs the median stays near 1
    assert 0.5 < step_ratio(target, target, context=32, trials=31) < 2.0


def test_the_hybrids_model_cost_is_spread_over_the_tokens_its_blocks_held():
    from bench.replay.advise import hybrid_cost_per_token

    # 96 model tokens among 141 tokens in blocks: the suffix side's 154 proposed (chained included) do not dilute it
    assert hybrid_cost_per_token(0.45, 96, 141) == pytest.approx(0.45 * 96 / 141)
    assert hybrid_cost_per_token(0.45, 0, 50) == 0.0 and hybrid_cost_per_token(0.45, 0, 0) == 0.0
    assert hybrid_cost_per_token(0.45, 10, 8) == 0.45  # never more than a model block's own cost


def test_the_hybrids_prompt_read_is_charged_only_to_the_requests_its_model_drafted_in():
    """The service's hybrid reads the prompt when its model first drafts: a request its suffix side answers
    throughout never pays it. Of two requests whose reads are each 20% of plain decoding's time, the hybrid's
    model drafted in the first only: its prediction is the one with that read, not both; a model draft pays both."""
    from bench.replay import loop as replay
    from bench.replay.advise import K_VALUES, predict_table
    from draft_service.ngram import NgramSequence

    runs = [([5, 17, 33, 42], [17, 33, 42, 17]), ([6, 7, 8, 9], [6, 7, 8, 9])]
    curve = {n: 1.0 + 0.05 * n for n in range(1, max(K_VALUES) + 2)}

    def drafts(model_drafted):
        seen: list[bool] = []

        def new_pass():
            seen.clear()

            def open_sequence(prompt_ids):
                seen.append(model_drafted[len(seen)])
                return NgramSequence(prompt_ids, 1, 4)
            return open_sequence
        return replay.Drafts("hybrid", new_pass, model_drafted=seen)

    def predicted(model_drafted, reads):
        table = predict_table(runs, drafts(model_drafted), 0.3, 0.1, curve, 0.0, 0.0, 0.0, reads)
        return [row["predicted"] for row in table]

    first_only = predicted([True, False], [0.2, 0.2])
    assert first_only == predicted([True, True], [0.2, 0.0])
    assert first_only > predicted([True, True], [0.2, 0.2])
    model = replay.Drafts("model", lambda: (lambda prompt_ids: NgramSequence(prompt_ids, 1, 4)))
    assert [row["predicted"] for row in predict_table(runs, model, 0.3, 0.1, curve, 0.0, 0.0, 0.0, [0.2, 0.2])] \
        == predicted([True, True], [0.2, 0.2])
