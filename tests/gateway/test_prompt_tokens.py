"""gateway.prompt_tokens: a prompt's tokens counted at a cost bounded by the limit (issue 32, defect 4)."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest

from gateway.prompt_tokens import PIECE_CHARS, Offload, PromptTooLong, bounded_ids, piece_end
from devkit.testing import build_tokenizer


class Spy:
    """An encode that records the length of every text it is given; `per_char` tokens per character."""

    def __init__(self, per_char: int = 3):
        self.per_char, self.seen = per_char, []

    def __call__(self, text: str) -> list[int]:
        self.seen.append(len(text))
        return [7] * (self.per_char * len(text))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def test_a_text_far_past_the_limit_is_refused_after_a_bounded_count_never_whole():
    spy = Spy(per_char=3)
    with pytest.raises(PromptTooLong) as raised:
        bounded_ids(spy, "字" * 2_000_000, limit=8192)
    assert max(spy.seen) <= PIECE_CHARS and sum(spy.seen) <= 2 * PIECE_CHARS
    assert raised.value.counted > 2 * 8192 and raised.value.total_chars == 2_000_000


def test_a_text_that_fits_gets_the_tokenizers_own_ids_for_the_whole_text(tokenizer):
    random.seed(3)
    words = ["the", "verifier", "accepts", "draft", "tokens", "字", "😀", "\n\n", "  "]
    text = " ".join(random.choice(words) for _ in range(6000))
    assert len(text) > 2 * PIECE_CHARS

    def encode(piece: str) -> list[int]:
        return tokenizer.encode(piece, add_special_tokens=False)

    whole = encode(text)
    assert bounded_ids(encode, text, limit=len(whole)) == whole
    with pytest.raises(PromptTooLong):
        bounded_ids(encode, text, limit=len(whole) // 3)


def test_pieces_end_where_a_word_starts_so_their_counts_add_up_to_the_whole(tokenizer):
    text = ("speculative decoding  keeps the\ttarget's distribution " * 700).strip()
    cuts, start = [], 0
    while start < len(text):
        start = piece_end(text, start)
        cuts.append(start)
    assert len(cuts) > 2 and all(text[cut].isspace() for cut in cuts[:-1])
    pieces = [text[a:b] for a, b in zip([0] + cuts, cuts)]
    assert "".join(pieces) == text
    count = sum(len(tokenizer.encode(piece, add_special_tokens=False)) for piece in pieces)
    assert count == len(tokenizer.encode(text, add_special_tokens=False))


def test_a_run_without_spaces_is_cut_at_the_piece_length():
    assert piece_end("字" * 20_000, 0) == PIECE_CHARS
    assert piece_end("short", 0) == 5


def test_offload_runs_at_most_its_workers_at_once():
    running, peak, lock = [0], [0], threading.Lock()
    release = threading.Event()

    def work():
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        release.wait(0.2)
        with lock:
            running[0] -= 1

    async def main():
        offload = Offload(2)
        await asyncio.gather(*(offload.run(work) for _ in range(6)))

    asyncio.run(main())
    assert peak[0] == 2
