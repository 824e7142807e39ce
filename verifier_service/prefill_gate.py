"""Admission of prefill work: at most a budget of prompt tokens prefill at once; the rest wait in arrival order.

Every prefilling sequence keeps one chunk job on the compute thread at a time, and a decoding sequence's
next round waits behind whatever chunk jobs are queued. The budget bounds that queue, so a long prompt
burst costs every other sequence at most a few chunks' time per round, and prompts are prefilled first come
first served rather than all at once (each would otherwise finish only when all do).

A prompt larger than the whole budget is admitted alone, once nothing else prefills: no prompt waits
forever. A waiting request holds no cache and runs no job; its wait is bounded by the work ahead of it
(--max-sequences and --max-cache-tokens bound that) and by the client's deadline.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import typing


class PrefillGate:
    def __init__(self, budget_tokens: int):
        """budget_tokens: prompt tokens prefilling at once at most; 0 admits everything at once."""
        self.budget_tokens = budget_tokens
        self.in_flight = 0  # prompt tokens of the admitted prefills
        self._waiting: collections.deque[tuple[int, asyncio.Future]] = collections.deque()

    @property
    def num_waiting(self) -> int:
        return sum(not waiter.done() for _, waiter in self._waiting)

    @contextlib.asynccontextmanager
    async def admitted(self, tokens: int) -> typing.AsyncIterator[None]:
        """Hold `tokens` of the budget while the block runs; wait for them first when they do not fit."""
        await self._acquire(tokens)
        try:
            yield
        finally:
            self._release(tokens)

    def _fits(self, tokens: int) -> bool:
        return self.budget_tokens <= 0 or self.in_flight == 0 or self.in_flight + tokens <= self.budget_tokens

    async def _acquire(self, tokens: int) -> None:
        if not self._waiting and self._fits(tokens):
            self.in_flight += tokens
            return
        waiter = asyncio.get_running_loop().create_future()
        entry = (tokens, waiter)
        self._waiting.append(entry)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():  # admitted as it was cancelled: hand the tokens back
                self._release(tokens)
            else:
                with contextlib.suppress(ValueError):
                    self._waiting.remove(entry)
                self._admit_waiting()  # it may have held back the ones behind it
            raise

    def _release(self, tokens: int) -> None:
        self.in_flight -= tokens
        self._admit_waiting()

    def _admit_waiting(self) -> None:
        """Admit waiting requests in arrival order while the first one fits."""
        while self._waiting:
            tokens, waiter = self._waiting[0]
            if waiter.done():
                self._waiting.popleft()
                continue
            if not self._fits(tokens):
                return
            self._waiting.popleft()
            self.in_flight += tokens
            waiter.set_result(None)
