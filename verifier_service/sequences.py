"""Live sequences: admission caps, expiry of calls whose client stopped reading, and freeing every cache.

A sequence is admitted with its worst-case cache size (prompt + max_tokens)
reserved, so the caps hold before memory runs out. It is released when its
Decode call ends for any reason: finished, cancelled, deadline, error.

A reaper cancels calls whose client stopped reading. It measures the client, not
the sequence: a server-streaming handler's `yield` returns only once gRPC has
written the message, and the write waits while the client's flow-control window
is full. So the reaper counts how long a response write has been pending; a
sequence waiting for compute (others' prefill, a long forward pass), for the
draft, or for prefill admission has no write pending and is never reaped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import typing

from specdec.runtime import metrics

log = logging.getLogger(__name__)


class CapacityExceeded(Exception):
    """Maps to RESOURCE_EXHAUSTED; the message says which cap."""


@dataclasses.dataclass
class LiveSequence:
    request_id: str
    reserved_tokens: int
    task: asyncio.Task | None
    writing_since: float | None = None  # when the pending response write began; None: no write pending
    reaped: bool = False
    # Called (as a new task) when the reaper drops the sequence: ends the call with a status, since a cancelled
    # handler alone leaves the client waiting until its own deadline.
    on_reap: typing.Callable[[], typing.Awaitable[None]] | None = None

    def write_started(self) -> None:
        self.writing_since = time.monotonic()

    def write_done(self) -> None:
        self.writing_since = None

    def write_blocked_s(self, now: float) -> float:
        """How long the pending response write has waited for the client (0 with none pending)."""
        return 0.0 if self.writing_since is None else now - self.writing_since


class SequenceRegistry:
    def __init__(self, max_sequences: int, max_cache_tokens: int, ttl_s: float):
        self.max_sequences = max_sequences
        self.max_cache_tokens = max_cache_tokens
        self.ttl_s = ttl_s
        self.live: dict[int, LiveSequence] = {}
        self._next_key = 0
        self._reaper: asyncio.Task | None = None
        self._reap_calls: set[asyncio.Task] = set()

    @property
    def reserved_tokens(self) -> int:
        return sum(s.reserved_tokens for s in self.live.values())

    def admit(self, request_id: str, reserved_tokens: int) -> tuple[int, LiveSequence]:
        if len(self.live) >= self.max_sequences:
            raise CapacityExceeded(f"the verifier holds {len(self.live)} live sequences, its cap "
                                   "(--max-sequences); retry later")
        if self.reserved_tokens + reserved_tokens > self.max_cache_tokens:
            raise CapacityExceeded(f"the KV caches would exceed {self.max_cache_tokens} tokens (--max-cache-tokens); "
                                   "retry later or lower max_tokens")
        self._next_key += 1
        sequence = LiveSequence(request_id, reserved_tokens, asyncio.current_task())
        self.live[self._next_key] = sequence
        self._publish()
        return self._next_key, sequence

    def release(self, key: int) -> None:
        self.live.pop(key, None)
        self._publish()

    def _publish(self) -> None:
        metrics.LIVE_SEQUENCES.set(len(self.live))
        metrics.CACHE_TOKENS.set(self.reserved_tokens)

    def start_reaper(self) -> None:
        if self._reaper is None and self.ttl_s > 0:
            self._reaper = asyncio.get_running_loop().create_task(self._reap_forever())

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(max(0.05, self.ttl_s / 4))
            self.reap()

    def reap(self) -> int:
        """Cancel calls whose response write has waited for the client past the TTL; their cleanup frees the caches."""
        now, reaped = time.monotonic(), 0
        for sequence in list(self.live.values()):
            blocked_s = sequence.write_blocked_s(now)
            if blocked_s > self.ttl_s and sequence.task is not None and not sequence.task.done():
                log.warning("request %s: the client has not read its next message for %.0f s: dropping its "
                            "sequence", sequence.request_id, blocked_s)
                sequence.reaped = True
                sequence.task.cancel()
                if sequence.on_reap is not None:
                    call = asyncio.get_running_loop().create_task(sequence.on_reap())
                    self._reap_calls.add(call)
                    call.add_done_callback(self._reap_calls.discard)
                reaped += 1
        return reaped
