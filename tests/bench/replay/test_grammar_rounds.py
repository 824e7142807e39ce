"""The grammar drafter's predicted rounds: forced tokens come in drafts of min(run, k), in the base's no-draft rounds."""

import pytest

from bench.core import speedup_model
from bench.replay.grammar_rounds import ForcedTokens, with_grammar


def test_grammar_alone_turns_the_forced_share_into_drafted_rounds():
    forced = ForcedTokens(share=0.4, run=5, acceptance=1.0)
    rounds = with_grammar(100, {0: 100.0}, forced, k=8)
    # 40 forced tokens in drafts of 5, each round emitting 5 + 1: 8 rounds for 48 tokens, 52 plain rounds left
    assert rounds == pytest.approx({0: 52.0, 5: 8.0})
    assert sum(rounds[b] * (b + 1 if b else 1) for b in rounds) == pytest.approx(100)
    assert speedup_model.predicted_speedup_of_rounds(100, rounds) == pytest.approx(100 / 60)  # free verification


def test_k_caps_the_block_and_rejections_cost_rounds():
    rounds = with_grammar(100, {0: 100.0}, ForcedTokens(share=0.4, run=8, acceptance=0.5), k=4)
    assert rounds[4] == pytest.approx(40 / 2)  # 2 of each 4 accepted
    assert rounds[0] == pytest.approx(100 - 20 * 3)


def test_on_top_of_a_base_draft_only_its_no_draft_rounds_are_open():
    base = {0: 30.0, 4: 10.0}  # the suffix draft: 10 rounds of 4 (all accepted: 50 tokens) and 30 plain rounds
    rounds = with_grammar(80, base, ForcedTokens(share=0.5, run=3, acceptance=1.0), k=4)
    assert rounds[4] == 10.0 and rounds[3] == pytest.approx(5.0) and rounds[0] == pytest.approx(10.0)
    # never more grammar rounds than the plain rounds' tokens allow
    capped = with_grammar(80, base, ForcedTokens(share=1.0, run=1, acceptance=1.0), k=4)
    assert capped[0] >= 0 and capped[1] == pytest.approx(15.0)


def test_forced_figures_are_checked():
    assert ForcedTokens(0.4).problems() == []
    assert len(ForcedTokens(0.0, run=0.5, acceptance=1.5).problems()) == 3
