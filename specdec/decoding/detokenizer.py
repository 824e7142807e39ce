"""Incremental detokenization that never splits a UTF-8 character.

Byte-level BPE can put one character's bytes in several tokens. Decoding each
token alone would emit U+FFFD halves; instead we decode a short window and emit
only the text that is complete (as vLLM and TGI do with prefix/read offsets).
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"
CONTEXT_TOKENS = 5  # prompt tokens decoded as context, so the first word's spacing is right


class IncrementalDetokenizer:
    """Feed token ids, get back the new complete text."""

    def __init__(self, tokenizer, prompt_ids: list[int]):
        self._tokenizer = tokenizer
        self._ids = list(prompt_ids[-CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self.text = ""  # all completion text emitted so far

    def push(self, token_ids: list[int]) -> str:
        """Append tokens; return the text they complete (possibly empty)."""
        new_text = []
        for token_id in token_ids:
            self._ids.append(int(token_id))
            prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
            full = self._decode(self._ids[self._prefix_offset :])
            if len(full) > len(prefix) and not full.endswith(REPLACEMENT):
                new_text.append(full[len(prefix) :])
                self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        delta = "".join(new_text)
        self.text += delta
        return delta

    @property
    def pending(self) -> str:
        """Complete characters held back because the last token also starts an incomplete one."""
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        return full[len(prefix) :].rstrip(REPLACEMENT) if len(full) > len(prefix) else ""

    def flush(self) -> str:
        """At the end: whatever is still held back (an incomplete character becomes U+FFFD)."""
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        delta = full[len(prefix) :] if len(full) > len(prefix) else ""
        self._prefix_offset = self._read_offset = len(self._ids)
        self.text += delta
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def find_stop(text: str, stop: list[str], search_from: int) -> tuple[int, str] | None:
    """The earliest stop-string match that ends after search_from: (start index, stop string)."""
    best = None
    for candidate in stop:
        start = text.find(candidate, max(0, search_from - len(candidate) + 1))
        if start >= 0 and (best is None or start < best[0]):
            best = (start, candidate)
    return best
