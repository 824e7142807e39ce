"""N-gram prompt lookup: propose the continuation of the latest earlier match of the sequence's suffix.

No model. It shines on copy-heavy work (edits, JSON/code rewrites) where the
output repeats spans of the input. An index maps each n-gram to the position
right after its latest occurrence, so a lookup costs O(max_n), not a rescan of
the context; rollback undoes index writes from a log.
"""

from __future__ import annotations

from specdec.decoding.draft_block import DraftBlock
from draft_service.proposer import DraftSequence, Proposer
from specdec.decoding.sampling import SamplingParams


class NgramSequence(DraftSequence):
    def __init__(self, prompt_ids: list[int], min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        # index[n-gram] = start of the continuation after its latest indexed occurrence
        self._index: dict[tuple[int, ...], int] = {}
        # _undo[i]: the index writes made when the n-grams ending at token i-1 were indexed
        self._undo: list[list[tuple[tuple[int, ...], int | None]]] = []
        super().__init__(prompt_ids)

    def propose(self, k: int) -> DraftBlock:
        tokens = self.tokens
        for n in range(min(self.max_n, len(tokens)), self.min_n - 1, -1):
            start = self._index.get(tuple(tokens[-n:]))
            if start is not None:
                proposal = tokens[start : start + k]
                self._extend(proposal)
                return DraftBlock(proposal, None)
        return DraftBlock.empty()

    def _extend(self, token_ids: list[int]) -> None:
        for token in token_ids:
            self.tokens.append(token)
            # The n-grams ending at the previous token now have a continuation (this token): index them.
            end = len(self.tokens) - 1  # continuation start
            writes = []
            for n in range(self.min_n, self.max_n + 1):
                if end - n < 0:
                    break
                key = tuple(self.tokens[end - n : end])
                writes.append((key, self._index.get(key)))
                self._index[key] = end
            self._undo.append(writes)

    def _truncate(self, length: int) -> None:
        while len(self.tokens) > length:
            self.tokens.pop()
            for key, previous in reversed(self._undo.pop()):
                if previous is None:
                    del self._index[key]
                else:
                    self._index[key] = previous


class NgramProposer(Proposer):
    method = "ngram"
    inline = True

    def __init__(self, min_n: int = 1, max_n: int = 4):
        self.min_n, self.max_n = min_n, max_n

    def start(self, prompt_ids: list[int], sampling: SamplingParams, return_probs: bool,
              tenant: str = "") -> NgramSequence:
        # Deterministic proposals: q is one-hot, whatever the sampling parameters.
        return NgramSequence(prompt_ids, self.min_n, self.max_n)
