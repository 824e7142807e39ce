"""gateway/streaming.py: the client's text stream, released only when complete and never showing a stop string."""

from __future__ import annotations

import pytest

from gateway.streaming import TextAssembler
from tests.tokenizer_cases import (
    MIXED_TEXT,
    TOKENIZERS,
    blocks,
    decode,
    encode,
    load,
    splits_a_character,
    stop_inside_a_straddling_token,
)
from specdec.decoding.stopping import StopChecker


def stream(assembler: TextAssembler, rounds: list[list[int]], matched_stop: str = "") -> list[str]:
    """What the client receives: one delta per round, then the rest at the end."""
    return [assembler.push(block) for block in rounds] + [assembler.finish(matched_stop)]


@pytest.mark.parametrize("name", TOKENIZERS)
@pytest.mark.parametrize("stop", [[], ["zzz", "\n\n"]], ids=["no-stop", "stops"])
@pytest.mark.parametrize("sizes", [[1], [2], [3, 1, 4]], ids=["one", "two", "mixed"])
def test_deltas_concatenate_to_the_full_text_and_never_split_a_character(name, stop, sizes):
    tokenizer = load(name)
    ids = encode(tokenizer, MIXED_TEXT)
    assert splits_a_character(tokenizer, ids), "the text must put some character's bytes in several tokens"
    assembler = TextAssembler(tokenizer, encode(tokenizer, "Repeat:"), stop)
    deltas = stream(assembler, blocks(ids, sizes))
    assert all("\ufffd" not in delta for delta in deltas), deltas
    assert "".join(deltas) == assembler.text == decode(tokenizer, ids) == MIXED_TEXT


@pytest.mark.parametrize("name", TOKENIZERS)
def test_without_stop_strings_complete_text_goes_out_at_once(name):
    tokenizer = load(name)
    assembler = TextAssembler(tokenizer, [], [])
    assert assembler.push(encode(tokenizer, "Hello #")) == "Hello #"
    assert assembler.finish("") == ""


@pytest.mark.parametrize("name", TOKENIZERS)
def test_characters_that_may_start_a_stop_string_are_held_back(name):
    tokenizer = load(name)
    assembler = TextAssembler(tokenizer, [], ["###"])  # holds the last 2 characters
    deltas = stream(assembler, [encode(tokenizer, piece) for piece in ["Hello #", "#", " world"]])
    assert deltas == ["Hello", " ", "## wor", "ld"]


@pytest.mark.parametrize("name", TOKENIZERS)
def test_a_partial_stop_string_at_the_end_goes_out_when_the_length_runs_out(name):
    tokenizer = load(name)
    assembler = TextAssembler(tokenizer, [], ["###"])
    assert stream(assembler, [encode(tokenizer, "Hello ##")]) == ["Hello ", "##"]


@pytest.mark.parametrize("name", TOKENIZERS)
@pytest.mark.parametrize("pieces", [
    ["answer: 42##", "#x"],  # the token that completes the stop also carries text after it
    ["answer: 4", "2", "###"],
    ["answer: 42###"],
], ids=["trailing", "separate", "one-round"])
def test_finish_cuts_the_stop_string_and_what_follows(name, pieces):
    tokenizer = load(name)
    assembler = TextAssembler(tokenizer, [], ["###", "\n\n"])
    deltas = stream(assembler, [encode(tokenizer, piece) for piece in pieces], matched_stop="###")
    assert "".join(deltas) == assembler.text == "answer: 42"
    assert all("#" not in delta for delta in deltas)


@pytest.mark.parametrize("name", TOKENIZERS)
def test_a_stop_string_at_the_very_start_leaves_no_text(name):
    tokenizer = load(name)
    assembler = TextAssembler(tokenizer, [], ["User:"])
    assert "".join(stream(assembler, [encode(tokenizer, "User: hi")], matched_stop="User:")) == ""


@pytest.mark.parametrize("name", TOKENIZERS)
@pytest.mark.parametrize("stop", ["🙂", "東京", "naïve", "done."])
def test_the_verifiers_cut_and_the_gateways_text_agree(name, stop):
    """StopChecker decides which tokens the verifier sends; TextAssembler turns them into the client's text."""
    tokenizer = load(name)
    prompt, ids = encode(tokenizer, "Repeat:"), encode(tokenizer, MIXED_TEXT)
    for sizes in ([1], [2], [4, 1]):
        checker = StopChecker([tokenizer.eos_token_id], 1000, [stop, "zzz"], tokenizer, prompt)
        assembler = TextAssembler(tokenizer, prompt, [stop, "zzz"])
        deltas = []
        for block in blocks(ids, sizes):
            checked = checker.check(block)
            deltas.append(assembler.push(checked.kept))
            assert stop not in assembler.text, "a stop string was shown to the client"
            if checked.finish_reason:
                deltas.append(assembler.finish(checked.matched_stop))
                break
        assert checked.matched_stop == stop, f"rounds of {sizes}"
        assert all("\ufffd" not in delta for delta in deltas)
        assert "".join(deltas) == MIXED_TEXT[: MIXED_TEXT.index(stop)], f"rounds of {sizes}"


@pytest.mark.parametrize("name", TOKENIZERS)
def test_a_stop_string_never_reaches_the_client_when_the_length_ends_on_it(name):
    tokenizer = load(name)
    ids, n, stop = stop_inside_a_straddling_token(tokenizer)
    checker = StopChecker([tokenizer.eos_token_id], n, [stop], tokenizer, [])
    assembler = TextAssembler(tokenizer, [], [stop])
    checked = checker.check(ids)
    text = assembler.push(checked.kept) + assembler.finish(checked.matched_stop)
    assert stop not in text, f"the client got {text!r} though {stop!r} is a stop string"
