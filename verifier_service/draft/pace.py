"""How long the draft takes to answer a round, measured, and so how long a round waits for it.

A model draft on a CPU may take longer to draft a block than a fixed timeout allows; waiting a fixed
time then fails every round, and the draft is never used. So the wait follows the draft:
- the draft's answer time is learnt server-wide for each block size asked (k), from rounds that waited
  for their answer; a size not asked yet is predicted from the nearest ones, never cheaper than a
  smaller size nor cheaper per token than a larger one (a draft's block costs a fixed part plus a
  part per token, so both bounds hold). Below the smallest size timed, only the second bound holds,
  and it is the one taken: priced at that size's whole cost, a smaller block never looked cheaper,
  so it was never asked and never timed. Until any block was timed, the policy asks for the
  configured k (`SpeculationPolicy.block_size`), not for a block priced as if drafting were free;
- the first round of a stream also waits while the draft reads the prompt: its extra time is learnt
  apart (`opening`), so that one long prompt does not make every later round wait longer (or every
  later block look dear: the policy prices block sizes not yet timed by this pace). Before any block
  was timed, a first round's whole time is the opening's. Per token read as well (`read_s`), so that
  the verifier can tell what reading a given sequence will cost a draft that has not read it yet (the
  hybrid's model: `SpeculationPolicy.model_read_pays`);
- a round that timed out is evidence too: the draft takes longer than that round waited, so the
  estimate grows to GROW times the wait (and the next round waits SLACK times that);
- the round's wait is SLACK times the prediction, at least --draft-timeout-ms (the floor) and at most
  the policy's cap: a block of k that arrives later than k plain steps loses even when accepted whole
  (`SpeculationPolicy.draft_wait_cap`). The flag is a floor, not a cap: it is what an unmeasured draft, or
  a fast one that stopped answering, costs; a slow draft measured to pay must still be waited for.
"""

from __future__ import annotations

from verifier_service.speculation.policy import Ewma

SLACK = 2.0  # a round waits this many times the predicted answer time
GROW = 2.0  # after a timeout, the draft is predicted to take this many times the wait that was too short
OPENING_ROUNDS = 4.0  # a stream's first round may wait this many times the cap more, while the draft reads the prompt


class DraftPace:
    """Server-wide: the draft's answer time by block size, and the wait a round gives it."""

    def __init__(self):
        self.seconds: dict[int, Ewma] = {}  # by block size asked
        self.opening = Ewma()  # a stream's first round: the answer time above predicted(k) (reading the prompt)
        self.read = Ewma()  # the same, per token the draft read in it

    def predicted(self, k: int, opening: bool = False) -> float | None:
        """The predicted answer time of a block of k (on a new stream: `opening`); None before any answer was timed."""
        known = {n: e.value for n, e in self.seconds.items() if e.value is not None}
        if not known or k <= 0:
            return None
        below = max((n for n in known if n <= k), default=None)
        above = min((n for n in known if n >= k), default=None)
        if below is not None and above is not None:
            t = known[below] if below == above else \
                known[below] + (known[above] - known[below]) * (k - below) / (above - below)
        elif below is not None:  # past the largest size timed: at its cost per token
            t = known[below] * k / below
        else:  # before the smallest: at its cost per token, the least it can cost (module docstring)
            t = known[above] * k / above
        return t + (self.opening.value or 0.0 if opening else 0.0)

    def read_s(self, tokens: int) -> float | None:
        """The predicted time a stream's first round takes, over its block's, to read `tokens` tokens; None before a
        first round was timed where its block's time was known (a server's first opening holds both, and charged
        to the read per token, a 30-token prompt's block made the read of a 600-token one look like 10 s)."""
        return self.read.value * tokens if self.read.value is not None and tokens > 0 else None

    def observe(self, k: int, wait_s: float, opening: bool = False, read_tokens: int = 0) -> None:
        """A round asked for k tokens and its answer came after wait_s (opening: a stream's first round, in which
        the draft read `read_tokens` tokens, 0: not known)."""
        if k <= 0 or wait_s <= 0:
            return
        if opening:
            before = self.predicted(k)
            if before is None:  # nothing to tell the block's part from the prompt's: the opening holds it all
                self.opening.add(wait_s)
                return
            if wait_s >= before:
                self.opening.add(wait_s - before)
                if read_tokens > 0:
                    self.read.add((wait_s - before) / read_tokens)
                return
            # faster than predicted even while reading the prompt: the block alone takes no longer than this
        self.seconds.setdefault(k, Ewma()).add(wait_s)

    def timed_out(self, k: int, waited_s: float, opening: bool = False, read_tokens: int = 0) -> None:
        """A round asked for k tokens and had no answer after waited_s: the draft takes longer than that."""
        if k <= 0 or waited_s <= 0:
            return
        floor = GROW * waited_s
        before = self.predicted(k)
        if opening:  # the draft was reading the prompt: that is slow, not (as far as is known) its blocks
            self.opening.value = max(self.opening.value or 0.0, floor - (before or 0.0))
            if read_tokens > 0 and before is not None:
                self.read.value = max(self.read.value or 0.0, (floor - before) / read_tokens)
            return
        estimate = self.seconds.setdefault(k, Ewma())
        estimate.value = max(estimate.value or 0.0, floor)
        estimate.samples += 1

    def wait_s(self, k: int, floor_s: float, cap_s: float | None, opening: bool = False) -> float:
        """How long a round asking for k tokens waits: SLACK times the prediction, within [floor_s, cap_s] (cap_s
        None: the target's step is not timed yet, and the draft's prediction alone decides). A stream's first
        round may wait OPENING_ROUNDS times the cap more, while the draft reads the prompt."""
        predicted = self.predicted(k, opening)
        if predicted is None:
            return floor_s
        wait = SLACK * predicted
        if cap_s is not None:
            wait = min(wait, cap_s + (OPENING_ROUNDS * cap_s if opening else 0.0))
        return max(floor_s, wait)
