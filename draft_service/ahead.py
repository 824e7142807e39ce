"""Drafting ahead (pipelined drafting), per sequence: what the next sync will be if this block is accepted,
the one block in flight, and whether drafting ahead pays for this sequence.

After a block of which the verifier will check the first `used` tokens, the draft knows round r+1's
sync if the verifier accepts them all: keep everything up to them, then append the target's next
token, which the draft guesses as its own next token (it proposes one token more than it sends). It
drafts that block at once and sends it unasked, tagged with the assumption. The verifier uses it only
if its real sync is exactly the assumed one; then the draft sends nothing more for that round (a hit).
Otherwise the sync rolls the draft back as usual and the draft answers the round (a miss).

One ahead block per sequence is in flight at a time. A sequence whose ahead blocks keep missing stops
drafting ahead for a while (`AheadGate`), so that it does not burn compute another sequence needs.
"""

from __future__ import annotations

import collections
import dataclasses

from specdec.runtime import metrics
from specdec.v1 import draft_pb2

MIN_HIT_RATE = 0.25  # below this, over the last WINDOW ahead blocks, drafting ahead pauses...
WINDOW = 8
PAUSE_ROUNDS = 16  # ...for this many rounds, then is tried again


@dataclasses.dataclass
class Block:
    """A block as the draft proposed it: `tokens` after `base` tokens; the verifier checks tokens[:used]."""

    base: int
    tokens: list[int]
    used: int

    def assumption(self) -> tuple[int, list[int]] | None:
        """The sync (keep_length, append_token_ids) that follows if the verifier accepts the whole block:
        None when the draft has no guess for the target's next token."""
        used = min(self.used, len(self.tokens))
        if len(self.tokens) <= used:
            return None
        return self.base + used, [self.tokens[used]]


@dataclasses.dataclass
class Pending:
    """The ahead block in flight: the round it answers and the sync it assumes."""

    round: int
    keep_length: int
    append_token_ids: list[int]
    block: Block

    def answers(self, sync: draft_pb2.NextBlock) -> bool:
        return (sync.num_tokens > 0 and sync.round == self.round and sync.keep_length == self.keep_length
                and list(sync.append_token_ids) == self.append_token_ids)


class AheadGate:
    """Whether drafting ahead pays for this sequence: it pauses for PAUSE_ROUNDS rounds when fewer than
    MIN_HIT_RATE of the last WINDOW ahead blocks were hits, then tries again."""

    def __init__(self):
        self.outcomes: collections.deque[bool] = collections.deque(maxlen=WINDOW)
        self.paused = 0

    def record(self, hit: bool) -> None:
        self.outcomes.append(hit)
        if len(self.outcomes) == WINDOW and sum(self.outcomes) < MIN_HIT_RATE * WINDOW:
            self.paused = PAUSE_ROUNDS
            self.outcomes.clear()

    def open(self) -> bool:
        if self.paused:
            self.paused -= 1
            return False
        return True


class DraftAhead:
    """One sequence's pipelining state on the draft."""

    def __init__(self, max_k: int):
        self.max_k = max_k
        self.gate = AheadGate()
        self.last: Block | None = None  # the block the verifier checks next (sent as an answer or ahead)
        self.pending: Pending | None = None
        self.round = 0  # the last round the verifier synced

    def sync(self, sync: draft_pb2.NextBlock) -> bool:
        """The verifier's sync for a round arrived: True when the ahead block in flight answered it (a hit)."""
        self.round = sync.round
        pending, self.pending = self.pending, None
        if pending is None or not sync.num_tokens:
            return False
        hit = pending.answers(sync)
        self.gate.record(hit)
        metrics.DRAFT_AHEAD.labels(outcome="hit" if hit else "miss").inc()
        if hit:
            pending.block.used = min(pending.block.used, sync.num_tokens)  # the verifier cut it to its k
            self.last = pending.block
        return hit

    def answered(self, block: Block) -> None:
        """The draft answered the round with `block`."""
        self.last = block

    def next_ahead(self, longest: int) -> tuple[int, list[int], int] | None:
        """(keep_length, append_token_ids, k) of the block to draft ahead, or None: no guess, paused, or the
        sequence would outgrow `longest`."""
        if self.last is None or not self.gate.open():
            return None
        assumption = self.last.assumption()
        if assumption is None:
            return None
        keep, append = assumption
        # the verifier's policy grows k by 2 after a fully accepted block: draft that many (it cuts a longer block)
        k = min(self.max_k, self.last.used + 2)
        if keep + len(append) + k + 1 > longest:
            return None
        return keep, append, k

    def sent(self, keep: int, append: list[int], block: Block) -> None:
        self.pending = Pending(self.round + 1, keep, append, block)
        metrics.DRAFT_AHEAD.labels(outcome="sent").inc()
