"""How many tokens to draft this round (k), per request.

A request that sets k gets exactly that k. A request that leaves it unset gets
adaptive speculation:
- k follows acceptance, as in Hugging Face's heuristic: +2 after a fully
  accepted block, -1 after a rejection, within [1, max_k];
- speculation turns off when it stops paying: the measured tokens per second
  of this request's drafted rounds falls below that of plain rounds (measured
  server-wide, and re-probed now and then). It is retried after a cool-down
  that doubles each time it fails again, so a request that reaches a
  copy-heavy stretch later can still win;
- speculation turns off while more sequences are live than
  `max_concurrency` (the target has no spare compute to verify with), and back
  on when load drops.
Every choice is lossless: k only changes how fast tokens arrive.
"""

from __future__ import annotations

import dataclasses

EWMA = 0.3  # weight of the newest round in the running averages
MIN_DRAFTED_ROUNDS = 4  # rounds of evidence before speculation may be turned off
COOLDOWN_ROUNDS = 8  # plain rounds before speculation is retried (doubles on each failed retry)
MAX_COOLDOWN_ROUNDS = 256
PROBE_EVERY = 64  # drafted rounds between plain rounds that refresh the plain-rate estimate


@dataclasses.dataclass
class Rate:
    """An exponentially weighted tokens-per-second estimate."""

    value: float | None = None

    def add(self, tokens: int, seconds: float) -> None:
        if seconds <= 0:
            return
        rate = tokens / seconds
        self.value = rate if self.value is None else (1 - EWMA) * self.value + EWMA * rate


class SpeculationPolicy:
    def __init__(self, default_k: int, max_k: int, requested_k: int | None = None, max_concurrency: int = 0,
                 plain: Rate | None = None):
        self.max_k = max_k
        self.fixed = requested_k is not None
        self.k = min(max_k, default_k if requested_k is None else requested_k)
        self.max_concurrency = max_concurrency
        self.drafted = Rate()  # tokens/s of this request's rounds that verified a draft block
        self.plain = plain if plain is not None else Rate()  # tokens/s of rounds without one (shared)
        self.drafted_rounds = 0
        self.since_probe = 0
        self.cooldown = 0  # plain rounds left before speculation is retried
        self.next_cooldown = COOLDOWN_ROUNDS
        self.off_reason = ""

    def block_size(self, remaining_tokens: int, remaining_context: int, live_sequences: int = 1) -> int:
        """k for the next round; 0 decodes without speculation."""
        self.off_reason = ""
        if not self.fixed:
            if self.max_concurrency and live_sequences > self.max_concurrency:
                self.off_reason = "load"
                return 0
            if self.cooldown > 0:
                self.cooldown -= 1
                self.off_reason = "not_paying"
                return 0
            if self.k and (self.plain.value is None or self.since_probe >= PROBE_EVERY):
                self.since_probe = 0
                self.off_reason = "probe"  # measure a plain round to compare against
                return 0
        # A round emits k + 1 tokens at most: keep it within max_tokens and the context.
        return max(0, min(self.k, remaining_tokens - 1, remaining_context - 1))

    def observe(self, num_draft_tokens: int, num_accepted: int, round_s: float) -> None:
        """Learn from a verified round: its draft size, accepted count and wall time."""
        emitted = num_accepted + 1
        if num_draft_tokens == 0:
            self.plain.add(emitted, round_s)
            return
        self.drafted.add(emitted, round_s)
        self.drafted_rounds += 1
        self.since_probe += 1
        if self.fixed:
            return
        self.k = min(self.max_k, self.k + 2) if num_accepted == num_draft_tokens else max(1, self.k - 1)
        if self._not_paying():
            self.cooldown = self.next_cooldown
            self.next_cooldown = min(MAX_COOLDOWN_ROUNDS, self.next_cooldown * 2)
            self.drafted_rounds = 0
            self.drafted = Rate()
        elif self.drafted_rounds >= MIN_DRAFTED_ROUNDS:
            self.next_cooldown = COOLDOWN_ROUNDS

    def _not_paying(self) -> bool:
        if self.drafted_rounds < MIN_DRAFTED_ROUNDS or self.plain.value is None or self.drafted.value is None:
            return False
        return self.drafted.value < self.plain.value
