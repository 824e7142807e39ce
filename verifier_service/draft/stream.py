"""One Propose call seen as numbered rounds: each round's block, and the blocks the draft sends ahead.

A reader task takes every message off the stream as it arrives, into a small bounded inbox, so that a
block the draft drafted ahead (pipelined drafting) is at hand the moment the previous round's outcome
is known. `ProposeStream.next_block` sends the round's sync (keep_length, append_token_ids, k) and returns
its block:
- an ahead block tagged with this round whose assumption is exactly this sync: when it has already
  arrived, the round waits for no round trip (the draft only confirms it: `answered_ahead`);
- otherwise the draft's ordinary answer to the round; or, when the draft says an ahead block answered
  the round but none here matched (a tag that did not parse), no block: the round is a plain step.
`send` and `answer` split the two for a round that decodes a plain step while the draft drafts (a far draft,
`DraftSession.prefetch`): the sync goes now, the answer is taken on the next round.
Anything else is discarded and counted: ahead blocks that assumed another outcome of the previous round,
blocks tagged with another round, and ahead blocks over the inbox bound (a draft that floods the stream
keeps the verifier's memory bounded). A block is never used for a round whose sync it did not assume.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses

import grpc

from specdec.runtime import metrics
from specdec.v1 import draft_pb2

MAX_INBOX = 4  # messages held per stream: a round's answer and an ahead block, with room to spare


class StreamEnded(Exception):
    """The draft ended the stream, or it failed; the message says how."""


@dataclasses.dataclass
class AheadCounts:
    """One sequence's ahead blocks: used (no round trip) and discarded; and its prefetched blocks (asked for
    during a plain step) by outcome."""

    used: int = 0
    discarded: int = 0
    prefetched: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def use(self) -> None:
        self.used += 1
        metrics.AHEAD_BLOCKS.labels(outcome="used").inc()

    def discard(self, why: str) -> None:
        self.discarded += 1
        metrics.AHEAD_BLOCKS.labels(outcome=f"discarded_{why}").inc()

    def prefetch(self, outcome: str) -> None:
        """A prefetched block's fate: "used", "missed" (the plain step's token was not its first) or "invalid"."""
        self.prefetched[outcome] += 1
        metrics.PREFETCHED_BLOCKS.labels(outcome=outcome).inc()


class ProposeStream:
    def __init__(self, call, counts: AheadCounts):
        self.call = call
        self.counts = counts
        self.round = 0  # the last round asked for
        self.answered = 0  # the last round that has its block: later messages for it are stale
        self.inbox: collections.deque[draft_pb2.ProposeResponse] = collections.deque()
        self.arrived = asyncio.Event()
        self.ended: StreamEnded | grpc.aio.AioRpcError | None = None
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        try:
            while (message := await self.call.read()) is not grpc.aio.EOF:
                if 0 < message.round <= self.answered:  # for a round already answered: stale on arrival
                    self._drop(message, "other_round")
                    continue
                if len(self.inbox) >= MAX_INBOX:
                    self._drop_stale()
                if len(self.inbox) >= MAX_INBOX:
                    if message.HasField("ahead"):
                        self._drop(message, "over_bound")
                        continue
                    self._drop(self.inbox.popleft(), "over_bound")
                self.inbox.append(message)
                self.arrived.set()
            self.ended = StreamEnded("the draft closed the stream")
        except grpc.aio.AioRpcError as exc:  # raised as it is: its code says whether the draft or the request failed
            self.ended = exc
        except (asyncio.CancelledError, asyncio.InvalidStateError, RuntimeError) as exc:
            self.ended = StreamEnded(f"the draft stream ended: {exc!r}")
        finally:
            self.arrived.set()

    def _drop(self, message: draft_pb2.ProposeResponse, why: str) -> None:
        if message.HasField("ahead"):
            self.counts.discard(why)

    def _drop_stale(self) -> None:
        for message in [m for m in self.inbox if 0 < m.round <= self.answered]:
            self.inbox.remove(message)
            self._drop(message, "other_round")

    async def _next_arrival(self) -> None:
        """Until the reader takes another message off the stream; raises what ended the stream, if it has ended."""
        if self.ended is not None:
            raise self.ended
        self.arrived.clear()
        await self.arrived.wait()

    @staticmethod
    def _assumes(message: draft_pb2.ProposeResponse, round_: int, keep_length: int, append_token_ids: list[int]) -> bool:
        """Whether `message` is a block drafted ahead for `round_` on exactly this sync."""
        return (message.HasField("ahead") and message.round == round_ and message.ahead.keep_length == keep_length
                and list(message.ahead.append_token_ids) == append_token_ids)

    async def send(self, keep_length: int, append_token_ids: list[int], k: int, sized_only: bool = False,
                   min_sized: int = 0) -> int:
        """Sync the draft and ask for up to k tokens (sized_only, min_sized: NextBlock's), without waiting for the
        answer; the round asked."""
        self.round += 1
        await self.call.write(draft_pb2.ProposeRequest(next=draft_pb2.NextBlock(
            keep_length=keep_length, append_token_ids=append_token_ids, num_tokens=k, round=self.round,
            sized_only=sized_only, min_sized=min_sized)))
        return self.round

    async def answer(self, round_: int) -> draft_pb2.ProposeResponse:
        """The draft's answer to `round_` (asked with `send`), waited for if it has not arrived; it leaves the inbox."""
        while True:
            for message in list(self.inbox):
                if not message.HasField("ahead") and message.round == round_:
                    self.inbox.remove(message)
                    self.answered = max(self.answered, round_)
                    return message
            await self._next_arrival()

    def has_answer(self, round_: int) -> bool:
        """Whether the draft's answer to `round_` (asked with `send`) has arrived, without waiting; raises what
        ended the stream, if it ended before answering."""
        if any(not message.HasField("ahead") and message.round == round_ for message in self.inbox):
            return True
        if self.ended is not None:
            raise self.ended
        return False

    def ahead_ready(self, keep_length: int, append_token_ids: list[int]) -> bool:
        """Whether a block drafted ahead for the next round, assuming exactly this sync, has arrived."""
        return any(self._assumes(message, self.round + 1, keep_length, append_token_ids) for message in self.inbox)

    async def next_block(self, keep_length: int, append_token_ids: list[int], k: int, sized_only: bool = False,
                         min_sized: int = 0) -> tuple[draft_pb2.ProposeResponse, bool]:
        """Sync the draft and ask for up to k tokens (sized_only, min_sized: NextBlock's); (the round's block,
        whether it came ahead). A block the draft says came ahead but that was discarded here is an empty message."""
        await self.send(keep_length, append_token_ids, k, sized_only, min_sized)
        while True:
            while self.inbox:
                message = self.inbox.popleft()
                if not message.HasField("ahead"):
                    if message.round in (self.round, 0):  # 0: a draft that does not number rounds
                        self.answered = self.round
                        return message, False
                    continue  # an answer to an earlier round (the confirmation of an ahead block used)
                if message.round != self.round:
                    self.counts.discard("other_round")
                elif not self._assumes(message, self.round, keep_length, append_token_ids):
                    self.counts.discard("missed")
                else:  # the caller counts it used once its tokens check out (AheadCounts.use)
                    self.answered = self.round
                    return message, True
            await self._next_arrival()

    async def finish(self, keep_length: int, append_token_ids: list[int], timeout_s: float = 5.0) -> None:
        """The last sync (the whole sequence, no block), then half-close and read the stream to its end."""
        self.round += 1
        await asyncio.wait_for(self.call.write(draft_pb2.ProposeRequest(next=draft_pb2.NextBlock(
            keep_length=keep_length, append_token_ids=append_token_ids, num_tokens=0, round=self.round))),
            timeout_s)
        await asyncio.wait_for(self.call.done_writing(), timeout_s)
        await asyncio.wait_for(asyncio.shield(self.reader), timeout_s)
