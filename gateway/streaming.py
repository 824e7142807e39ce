"""Turn the verifier's token stream into the client's text stream.

Text is released only when complete: no UTF-8 character is split, and with
stop strings the last few characters are held back until it is certain they
do not start a stop string (which is cut from the output).
"""

from __future__ import annotations

from specdec.decoding.detokenizer import IncrementalDetokenizer, find_stop


class TextAssembler:
    def __init__(self, tokenizer, prompt_ids: list[int], stop: list[str]):
        self._detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids)
        self._stop = list(stop)
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._sent = 0

    def push(self, token_ids: list[int]) -> str:
        """New text that is safe to send now."""
        self._detokenizer.push(token_ids)
        safe = len(self._detokenizer.text) - self._hold
        match = find_stop(self._detokenizer.text, self._stop, self._sent) if self._stop else None
        return self._release(safe if match is None else min(safe, match[0]))

    def finish(self, matched_stop: str) -> str:
        """The rest of the text, cut before the stop string that ended generation."""
        self._detokenizer.flush()
        text = self._detokenizer.text
        end = text.find(matched_stop) if matched_stop else -1
        return self._release(end if end >= 0 else len(text))

    @property
    def text(self) -> str:
        return self._detokenizer.text[: self._sent]

    def _release(self, upto: int) -> str:
        if upto <= self._sent:
            return ""
        delta = self._detokenizer.text[self._sent : upto]
        self._sent = upto
        return delta
