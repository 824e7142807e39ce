"""The advisor's replay and in-process speculative loop, with the draft service's own proposers."""

import pytest

from bench.replay import loop as replay

PROMPT = [5, 6, 7, 8, 9]


def test_accept_greedy_is_the_longest_common_prefix():
    assert replay.accept_greedy([1, 2, 3], [1, 2, 4, 5]) == 2
    assert replay.accept_greedy([], [1]) == 0
    assert replay.accept_greedy([1, 2], [1]) == 1


def test_ngram_replay_copies_from_the_prompt():
    # The continuation repeats the prompt: after its first token, n-gram lookup proposes the rest.
    stats = replay.replay([(PROMPT, [5, 6, 7, 8, 9])], 4, replay.ngram_drafts().new_pass())
    assert stats.tokens == 5
    assert stats.rounds_by_block == {0: 1, 3: 1}  # no match for the last prompt token; then a block of 3
    assert stats.accepted == 3 and stats.rounds == 2  # round 1: no draft yet (9 -> 5 unseen); round 2: 3 + 1


def test_suffix_learns_from_earlier_prompts_in_the_same_pass():
    output = [40, 41, 42, 43, 44, 45, 46, 47]
    runs = [([1, 2, 3], output), ([9, 8, 7], output), ([4, 4, 4], output)]
    stats = [replay.replay([run], 4, opener) for opener in [replay.suffix_drafts().new_pass()] for run in runs]
    first, second, third = stats
    assert first.accepted == 0  # nothing cached, nothing in the prompt
    assert second.accepted > 0 and third.accepted >= second.accepted  # the earlier outputs are cached
    assert second.rounds < first.rounds
    # A new pass starts with an empty cache.
    assert replay.replay([runs[1]], 4, replay.suffix_drafts().new_pass()).accepted == 0


def test_replay_and_the_real_loop_agree_on_the_tiny_model(tiny_pair):
    """speculative_greedy emits exactly plain greedy (fp32), and accepts what the replay predicts."""
    from specdec.modeling.models import load_causal_lm

    target = load_causal_lm(str(tiny_pair[0]), dtype="float32")
    prompt = [5, 17, 33, 17, 33, 17, 33, 42]
    plain_stats = replay.ReplayStats()
    plain = replay.speculative_greedy(target, prompt, 24, 0, None, eos=set(), stats=plain_stats)
    assert len(plain) == 24 and plain_stats.rounds == 24 and plain_stats.drafted == 0
    for drafts in (replay.ngram_drafts(), replay.suffix_drafts()):
        loop_stats = replay.ReplayStats()
        out = replay.speculative_greedy(target, prompt, 24, 4, drafts.new_pass()(prompt), eos=set(), stats=loop_stats)
        assert out == plain
        predicted = replay.replay([(prompt, plain)], 4, drafts.new_pass())
        assert (loop_stats.accepted, loop_stats.rounds) == (predicted.accepted, predicted.rounds)
    eos_stop = replay.speculative_greedy(target, prompt, 24, 0, None, eos={plain[3]})
    assert eos_stop == plain[:plain.index(plain[3]) + 1]


@pytest.mark.parametrize("k", [1, 3])
def test_model_drafts_replay_a_draft_that_equals_the_target_accepts_everything(tiny_pair, k):
    from specdec.modeling.models import load_causal_lm

    target = load_causal_lm(str(tiny_pair[0]), dtype="float32")
    prompt = [5, 17, 33, 42]
    plain = replay.speculative_greedy(target, prompt, 12, 0, None, eos=set())
    stats = replay.replay([(prompt, plain)], k, replay.model_drafts(target, 8).new_pass())
    assert stats.accepted == stats.drafted > 0 and stats.tokens == 12


def test_a_live_hybrid_runs_the_draft_model_every_pass_and_accepts_what_the_replay_predicts(tiny_pair):
    """The live hybrid (for timing) drafts with the service's model draft: a forward per model token on every pass,
    where the replay's memoised model drafts the same text for free the second time; both accept the same."""
    from specdec.modeling.models import load_causal_lm

    target, draft = (load_causal_lm(str(path), dtype="float32") for path in tiny_pair)
    prompt = [5, 17, 33, 17, 33, 17, 33, 42]
    plain = replay.speculative_greedy(target, prompt, 16, 0, None, eos=set())
    forwards = []
    handle = draft.register_forward_hook(lambda module, args, out: forwards.append(1))
    try:
        counts = []
        for live in (False, True):
            drafts = replay.hybrid_drafts(draft, 8, live=live)
            stats = []
            for _ in range(2):
                forwards.clear()
                loop_stats = replay.ReplayStats()
                out = replay.speculative_greedy(target, prompt, 16, 4, drafts.new_pass()(prompt), eos=set(),
                                                stats=loop_stats)
                assert out == plain
                stats.append((loop_stats.accepted, loop_stats.rounds))
                counts.append((live, len(forwards)))
            assert stats[0] == stats[1]
    finally:
        handle.remove()
    (_, replay_first), (_, replay_second), (_, live_first), (_, live_second) = counts
    assert replay_second == 0 < replay_first  # memoised: the second pass over the same text costs nothing
    assert live_first == live_second > 0
