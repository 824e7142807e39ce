"""specdec/decoding/detokenizer.py: incremental text that never splits a UTF-8 character, and stop-string search."""

from __future__ import annotations

import pytest

from specdec.decoding.detokenizer import IncrementalDetokenizer, find_stop
from tests.tokenizer_cases import MIXED_TEXT, TOKENIZERS, blocks, decode, encode, load, splits_a_character


@pytest.mark.parametrize("name", TOKENIZERS)
@pytest.mark.parametrize("sizes", [[1], [2], [3, 1, 4], [1000]], ids=["one", "two", "mixed", "all"])
def test_pushes_concatenate_to_the_full_decode_and_never_emit_half_a_character(name, sizes):
    tokenizer = load(name)
    ids = encode(tokenizer, MIXED_TEXT)
    assert splits_a_character(tokenizer, ids), "the text must put some character's bytes in several tokens"
    full = decode(tokenizer, ids)
    detokenizer = IncrementalDetokenizer(tokenizer, [])
    pieces = []
    for block in blocks(ids, sizes):
        piece = detokenizer.push(block)
        assert "\ufffd" not in piece, f"half a character emitted after {block}"
        pieces.append(piece)
        assert full.startswith(detokenizer.text), "text emitted so far is not a prefix of the final text"
    assert detokenizer.flush() == ""
    assert "".join(pieces) == detokenizer.text == full == MIXED_TEXT


@pytest.mark.parametrize("name", TOKENIZERS)
@pytest.mark.parametrize("character", ["🙂", "東", "é"])
def test_a_character_comes_out_whole_in_one_push(name, character):
    tokenizer = load(name)
    ids = encode(tokenizer, f"a{character}b")
    detokenizer = IncrementalDetokenizer(tokenizer, encode(tokenizer, "Say:"))
    released = [detokenizer.push([token]) for token in ids]
    assert all("\ufffd" not in piece for piece in released), released
    assert "".join(released) == f"a{character}b"
    assert sum(character in piece for piece in released) == 1, "the character must not be cut between pushes"


@pytest.mark.parametrize("name", TOKENIZERS)
def test_an_unfinished_character_is_held_until_flush(name):
    tokenizer = load(name)
    ids = encode(tokenizer, "ok 東京")[:-1]  # the last byte of 京 never arrives
    assert "\ufffd" in decode(tokenizer, ids), "京 must span several tokens"
    detokenizer = IncrementalDetokenizer(tokenizer, [])
    pushed = detokenizer.push(ids)
    assert pushed.startswith("ok") and "\ufffd" not in pushed
    flushed = detokenizer.flush()
    assert "\ufffd" in flushed and pushed + flushed == decode(tokenizer, ids)
    assert detokenizer.flush() == "" and detokenizer.push([]) == ""  # nothing is emitted twice


@pytest.mark.parametrize("name", TOKENIZERS)
def test_the_prompt_gives_context_but_is_never_emitted(name):
    tokenizer = load(name)
    prompt = encode(tokenizer, "The quick brown fox jumps over the")
    completion = encode(tokenizer, " lazy dog.")
    detokenizer = IncrementalDetokenizer(tokenizer, prompt)
    text = "".join(detokenizer.push([token]) for token in completion)
    assert text == decode(tokenizer, prompt + completion)[len(decode(tokenizer, prompt)):] == " lazy dog."


@pytest.mark.parametrize("name", TOKENIZERS)
def test_special_tokens_add_no_text(name):
    tokenizer = load(name)
    detokenizer = IncrementalDetokenizer(tokenizer, [])
    assert detokenizer.push(encode(tokenizer, "done") + [tokenizer.eos_token_id]) == "done"
    assert detokenizer.text == "done"


def test_find_stop_picks_the_earliest_of_several_stop_strings():
    text = "answer: 42\nUser: more\n###"
    assert find_stop(text, ["###", "User:"], 0) == (11, "User:")
    assert find_stop(text, ["User:", "###"], 0) == (11, "User:")
    assert find_stop(text, ["nope", "also nope"], 0) is None
    assert find_stop(text, [], 0) is None


def test_find_stop_with_overlapping_stop_strings():
    # Two stop strings that overlap in the text: the one that starts first wins, wherever it ends.
    assert find_stop("xxabcd", ["bcd", "abc"], 0) == (2, "abc")
    # One stop string that is a prefix of another starts at the same place: the match starts there.
    start, stop = find_stop("xxabcd", ["abcd", "ab"], 0)
    assert start == 2 and stop in {"abcd", "ab"}
    # A stop string that overlaps itself ("aa" in "aaa") matches at its first occurrence.
    assert find_stop("baaa", ["aa"], 0) == (1, "aa")


def test_find_stop_only_reports_matches_that_end_after_search_from():
    text = "END of part one; END"
    assert find_stop(text, ["END"], 0) == (0, "END")
    # search_from is how much text was searched before: a match that ended by then was seen already.
    assert find_stop(text, ["END"], 3) == (17, "END")
    assert find_stop(text, ["END"], len(text)) is None
    # A match that straddles search_from (started in old text, ends in new) is found.
    assert find_stop("abc ST" + "OP", ["STOP"], len("abc ST")) == (4, "STOP")
    assert find_stop("abc STOP", ["STOP"], len("abc S")) == (4, "STOP")
    assert find_stop("abc STOP", ["STOP", "c"], len("abc S")) == (4, "STOP")  # "c" ended before search_from
