"""When a sequence ends: EOS, stop strings and max_tokens, even inside a block.

The verifier checks every round with it; the gateway checks a resumed request's whole output with it
(a stop string can span the tokens of two verifiers).

A round can emit several tokens; no token past the first stop condition is kept.
Stop strings are matched on the detokenized completion.
"""

from __future__ import annotations

import dataclasses

from specdec.decoding.detokenizer import IncrementalDetokenizer, find_stop

STOP = "stop"
LENGTH = "length"


@dataclasses.dataclass
class Checked:
    kept: list[int]  # the emitted tokens up to and including the one that ended the sequence
    finish_reason: str | None  # None (go on), STOP or LENGTH
    matched_stop: str = ""


class StopChecker:
    def __init__(self, eos_token_ids: list[int], max_tokens: int, stop: list[str] = (), tokenizer=None,
                 prompt_ids: list[int] = ()):
        self.eos = set(eos_token_ids)
        self.max_tokens = max_tokens
        self.stop = list(stop)
        self.generated = 0
        self._detokenizer = IncrementalDetokenizer(tokenizer, list(prompt_ids)) if self.stop else None
        self._searched = 0  # characters (released + held back) already searched for a stop string

    @property
    def remaining(self) -> int:
        return self.max_tokens - self.generated

    def check(self, emitted: list[int]) -> Checked:
        for i, token in enumerate(emitted):
            self.generated += 1
            kept = emitted[: i + 1]
            if token in self.eos:
                return Checked(kept, STOP)
            if self._detokenizer is not None:
                # held-back text counts: a token can complete a stop string and start the next character
                searched = self._searched
                self._detokenizer.push([token])
                text = self._detokenizer.text + self._detokenizer.pending
                self._searched = len(text)
                match = find_stop(text, self.stop, searched)
                if match:
                    return Checked(kept, STOP, match[1])
            if self.generated >= self.max_tokens:
                return Checked(kept, LENGTH)
        return Checked(list(emitted), None)
