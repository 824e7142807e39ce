"""Tokenize a prompt at a cost bounded by the context, however long or dense the text is.

A prompt's length in characters says little about its length in tokens (a character can take several
tokens), so the gateway does not tokenize a long text whole to learn that it cannot fit. It counts the
text's tokens piece by piece and refuses it as soon as the count is clearly past the limit; only a text
whose count shows that it may fit is tokenized whole, so an accepted prompt's ids are exactly the
tokenizer's own ids for the whole text.

Pieces end where a word starts (before a whitespace character that a non-space follows), where the
tokenizers' pre-tokenizers split too, so the pieces' counts add up to the whole text's count; a run with no
such place is cut at the piece length, which can change the count near the cut by a few tokens either way.
The count therefore refuses only once it passes twice the limit (no cut shifts it that far), and a count
between the limit and twice the limit is settled by tokenizing whole, which costs at most about twice what a
fitting prompt costs.

The work runs on a small, fixed pool of threads (`Offload`), so concurrent requests queue for it instead of
each holding its own copy of a tokenization at once, and the event loop stays free.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import typing

# Characters per piece: small enough that one piece's tokens cost little, large enough to keep the per-call
# overhead of the tokenizer negligible.
PIECE_CHARS = 8192
# How far back from the piece length to look for the start of a word.
SEARCH_CHARS = PIECE_CHARS // 4


class PromptTooLong(ValueError):
    """The text has more tokens than the limit; `counted` tokens were seen in its first `chars` characters."""

    def __init__(self, counted: int, chars: int, total_chars: int):
        super().__init__(f"more than {counted} tokens in its first {chars} of {total_chars} characters")
        self.counted, self.chars, self.total_chars = counted, chars, total_chars


class Offload:
    """A fixed number of worker threads for CPU work that would otherwise stall the event loop (tokenizing,
    rendering chat templates, scanning request bodies); requests beyond it wait their turn."""

    def __init__(self, workers: int):
        self.pool = concurrent.futures.ThreadPoolExecutor(max(1, workers), thread_name_prefix="gateway-prepare")

    async def run(self, fn: typing.Callable, *args):
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)


def piece_end(text: str, start: int, piece_chars: int = PIECE_CHARS) -> int:
    """Where the piece that starts at `start` ends: at the start of a word near the piece length if there is
    one (the index of the whitespace before it), else at the piece length."""
    end = start + piece_chars
    if end >= len(text):
        return len(text)
    for cut in range(end, max(start + 1, end - SEARCH_CHARS), -1):
        if text[cut].isspace() and not text[cut - 1].isspace() and cut + 1 < len(text) \
                and not text[cut + 1].isspace():
            return cut
    return end


def bounded_ids(encode: typing.Callable[[str], list[int]], text: str, limit: int,
                piece_chars: int = PIECE_CHARS) -> list[int]:
    """The token ids of `text` (encode(text)), or PromptTooLong once a count in pieces passes twice `limit`.

    encode: the tokenizer's text -> ids, without special tokens. The caller still checks the ids against the
    limit: this only guarantees that a text far too long is never tokenized whole."""
    if len(text) > piece_chars:
        counted, start = 0, 0
        while start < len(text):
            end = piece_end(text, start, piece_chars)
            counted += len(encode(text[start:end]))
            if counted > 2 * limit:
                raise PromptTooLong(counted, end, len(text))
            start = end
    return encode(text)
