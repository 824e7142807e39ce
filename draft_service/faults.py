"""Fault injection for tests and benchmarks: a slow draft, wrong ahead blocks, one token drafted everywhere.
Refused unless asked for.

The draft service's config inherits these options; a service started with any of them and without
--enable-fault-injection refuses to start, so a production deployment cannot turn one on by mistake.
"""

from __future__ import annotations

import dataclasses

from specdec.runtime.config import option
from specdec.v1 import draft_pb2


@dataclasses.dataclass(frozen=True)
class FaultInjection:
    """Fault injection (tests and benchmarks only)"""

    enable_fault_injection: bool = option(False, "allow the --inject-* options (tests and benchmarks only)")
    inject_delay_ms: float = option(0.0, "sleep this long before each block (needs --enable-fault-injection)")
    inject_ahead_fault: str = option("", "send every ahead block with wrong tokens (wrong_tokens) or a wrong tag "
                                         "(wrong_tag), or flood 16 extra per round (flood) (needs "
                                         "--enable-fault-injection)", choices=["", "wrong_tokens", "wrong_tag", "flood"])
    inject_draft_token: int = option(-1, "send every block, ahead ones too, as this token id in each slot (e.g. one the "
                                         "request's grammar forbids; past the grammar drafter, so it is not cut here); "
                                         "-1: off (needs --enable-fault-injection)")

    def __post_init__(self):
        asked = [name for name, on in (("--inject-delay-ms", self.inject_delay_ms),
                                       ("--inject-ahead-fault", self.inject_ahead_fault),
                                       ("--inject-draft-token", self.inject_draft_token >= 0)) if on]
        if asked and not self.enable_fault_injection:
            raise ValueError(f"{' and '.join(asked)} inject faults for tests and benchmarks; add "
                             "--enable-fault-injection true to use them")


def inject_ahead_fault(fault: str, message: draft_pb2.ProposeResponse, vocab_size: int) -> list:
    """--inject-ahead-fault: every ahead block wrong, mis-tagged, or flooded."""
    if fault == "wrong_tokens":
        message.token_ids[:] = [(t + 1) % vocab_size for t in message.token_ids]
    elif fault == "wrong_tag":
        message.ahead.keep_length += 1
    elif fault == "flood":
        extra = draft_pb2.ProposeResponse()
        extra.CopyFrom(message)
        extra.ahead.keep_length += 1
        return [message] + [extra] * 16
    return [message]


def inject_draft_token(token: int, message: draft_pb2.ProposeResponse) -> draft_pb2.ProposeResponse:
    """--inject-draft-token: every proposed token replaced by `token` (a greedy block: no q, nothing forced)."""
    if token >= 0:
        message.token_ids[:] = [token] * len(message.token_ids)
        message.probs, message.num_chained, message.num_forced = b"", 0, 0
    return message
