"""specdec/decoding/stopping.py: a sequence ends at EOS, a stop string or max_tokens, even inside a block.

A round emits a block of tokens; the checker keeps them up to and including the one that ended the
sequence and nothing after it. Stop strings are matched on the completion's text, across rounds.
"""

from __future__ import annotations

import pytest

from tests.tokenizer_cases import MIXED_TEXT, TOKENIZERS, blocks, decode, encode, load, stop_inside_a_straddling_token
from specdec.decoding.stopping import LENGTH, STOP, StopChecker

EOS = 2


def run_rounds(checker: StopChecker, rounds: list[list[int]]) -> list:
    """Feed blocks until the checker ends the sequence; every result, in order."""
    results = []
    for block in rounds:
        results.append(checker.check(block))
        if results[-1].finish_reason:
            break
    return results


def kept_tokens(results) -> list[int]:
    return [token for result in results for token in result.kept]


def shortest_prefix_with(tokenizer, ids: list[int], stop: str) -> int:
    """How many tokens of ids it takes until the decoded completion contains stop (the test's oracle)."""
    return next(n for n in range(1, len(ids) + 1) if stop in decode(tokenizer, ids[:n]))


def test_eos_inside_a_block_ends_there():
    checker = StopChecker([EOS, 7], max_tokens=100)
    first = checker.check([10, 11, 12])
    assert first.kept == [10, 11, 12] and first.finish_reason is None
    second = checker.check([13, 7, 14, 15])
    assert second.kept == [13, 7] and second.finish_reason == STOP and second.matched_stop == ""
    assert checker.generated == 5


def test_max_tokens_inside_a_block_ends_there():
    checker = StopChecker([EOS], max_tokens=5)
    assert checker.check([10, 11, 12]).finish_reason is None
    assert checker.remaining == 2
    ended = checker.check([13, 14, 15, 16])
    assert ended.kept == [13, 14] and ended.finish_reason == LENGTH
    assert checker.generated == 5 and checker.remaining == 0


def test_eos_on_the_last_allowed_token_is_a_stop_not_a_length():
    checker = StopChecker([EOS], max_tokens=3)
    ended = checker.check([10, 11, EOS, 12])
    assert ended.kept == [10, 11, EOS] and ended.finish_reason == STOP


@pytest.mark.parametrize("name", TOKENIZERS)
@pytest.mark.parametrize("pieces", [
    ["The quick bro", "wn fox jumps over"],  # straddles two blocks
    ["Say b", "r", "ow", "n fox, then more"],  # first characters in one round, the rest over later rounds
    ["a bro", "ken arrow, then bro", "wn", " again"],  # a false start before the real match
    ["brown", " fox"],  # the whole stop string in the first round
], ids=["straddle", "later-rounds", "false-start", "first-round"])
def test_a_stop_string_across_rounds_keeps_no_token_past_it(name, pieces):
    tokenizer = load(name)
    rounds = [encode(tokenizer, piece) for piece in pieces]
    ids = [token for block in rounds for token in block]
    checker = StopChecker([tokenizer.eos_token_id], 100, ["brown"], tokenizer, encode(tokenizer, "Go on:"))
    results = run_rounds(checker, rounds)
    assert [r.finish_reason for r in results] == [None] * (len(results) - 1) + [STOP]
    assert results[-1].matched_stop == "brown"
    assert all(r.kept == block for r, block in zip(results[:-1], rounds)), "unfinished rounds keep their block"
    kept = kept_tokens(results)
    assert kept == ids[: shortest_prefix_with(tokenizer, ids, "brown")]
    assert "brown" in decode(tokenizer, kept) and "brown" not in decode(tokenizer, kept[:-1])
    assert len(kept) < len(ids) and checker.generated == len(kept)


@pytest.mark.parametrize("name", TOKENIZERS)
def test_a_stop_string_split_at_every_token_boundary(name):
    tokenizer = load(name)
    ids = encode(tokenizer, "Result: done. ### trailing text")
    expected = ids[: shortest_prefix_with(tokenizer, ids, "###")]
    for cut in range(len(ids)):
        checker = StopChecker([tokenizer.eos_token_id], 100, ["###", "never"], tokenizer, [])
        results = run_rounds(checker, [ids[:cut], ids[cut:]])
        assert kept_tokens(results) == expected, f"cut after {cut} tokens"
        assert results[-1].finish_reason == STOP and results[-1].matched_stop == "###"


@pytest.mark.parametrize("name", TOKENIZERS)
@pytest.mark.parametrize("stop", ["🙂", "東京"])
def test_a_multibyte_stop_string_split_across_rounds(name, stop):
    tokenizer = load(name)
    ids = encode(tokenizer, MIXED_TEXT)
    expected = ids[: shortest_prefix_with(tokenizer, ids, stop)]
    for sizes in ([1], [2], [3], [2, 5]):
        checker = StopChecker([tokenizer.eos_token_id], 1000, [stop], tokenizer, [])
        results = run_rounds(checker, blocks(ids, sizes))
        assert kept_tokens(results) == expected, f"rounds of {sizes}"
        assert results[-1].finish_reason == STOP and results[-1].matched_stop == stop


@pytest.mark.parametrize("name", TOKENIZERS)
def test_stop_strings_match_the_completion_only(name):
    tokenizer = load(name)
    checker = StopChecker([tokenizer.eos_token_id], 100, ["END"], tokenizer, encode(tokenizer, "Say END then EN"))
    result = checker.check(encode(tokenizer, "D and more"))  # "EN" + "D" straddles the prompt: no match
    assert result.finish_reason is None


@pytest.mark.parametrize("name", TOKENIZERS)
def test_eos_ends_a_block_before_any_later_stop_string(name):
    tokenizer = load(name)
    checker = StopChecker([tokenizer.eos_token_id], 100, ["brown"], tokenizer, [])
    block = encode(tokenizer, "quick") + [tokenizer.eos_token_id] + encode(tokenizer, "brown")
    result = checker.check(block)
    assert result.finish_reason == STOP and result.matched_stop == ""
    assert result.kept == block[: block.index(tokenizer.eos_token_id) + 1]


@pytest.mark.parametrize("name", TOKENIZERS)
def test_a_stop_string_on_the_last_allowed_token_is_reported_as_the_stop(name):
    tokenizer = load(name)
    ids = encode(tokenizer, "the brown fox")
    n = shortest_prefix_with(tokenizer, ids, "brown")
    checker = StopChecker([tokenizer.eos_token_id], n, ["brown"], tokenizer, [])
    result = checker.check(ids)
    assert result.kept == ids[:n] and result.finish_reason == STOP and result.matched_stop == "brown"


@pytest.mark.parametrize("name", TOKENIZERS)
def test_a_stop_string_completed_by_a_token_that_starts_the_next_character(name):
    tokenizer = load(name)
    ids, n, stop = stop_inside_a_straddling_token(tokenizer)
    assert stop in decode(tokenizer, ids[:n]) and stop not in decode(tokenizer, ids[: n - 1])
    checker = StopChecker([tokenizer.eos_token_id], 100, [stop], tokenizer, [])
    results = run_rounds(checker, [[token] for token in ids])
    assert results[-1].matched_stop == stop
    assert kept_tokens(results) == ids[:n]
