"""The verifier's side of the draft stream: one bidirectional Propose call per sequence.

`DraftLink` owns the channel to one draft replica and a shared back-off: when
the draft fails, every sequence decodes without it until the back-off expires,
then the next sequence to ask reconnects. With several replicas
(verifier_service.draft.tier), each has its link, and a sequence's session
asks the tier which replica to open its stream on. `DraftSession` is one sequence's
handle: its stream and its position in the draft; it can also ask for a block without
waiting (`prefetch`) and take the answer on the next round (`at_hand`). Any failure (the draft died,
was too slow, or answered nonsense) gives that round an empty block with the
reason, and the engine carries on without speculation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import typing

import grpc
import numpy as np
import torch

from specdec.runtime import grpc_server, metrics
from specdec.modeling import models
from specdec.runtime.config import ServerConfig
from specdec.decoding.draft_block import DraftBlock
from specdec.decoding.sampling import SamplingParams, to_proto
from specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc
from verifier_service.draft.pace import DraftPace
from verifier_service.draft.stream import AheadCounts, ProposeStream, StreamEnded

log = logging.getLogger(__name__)


# Errors about one request (the draft refused it, or dropped its idle stream: ABORTED, the draft's
# --sequence-ttl-s), not about the draft: they do not back off other sequences.
REQUEST_ERRORS = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
                            grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.ABORTED})


_DRAINING: set[asyncio.Task] = set()  # strong references to streams being closed


@dataclasses.dataclass(frozen=True)
class Constrained:
    """A structured-output request's constraint, sent to the draft so that its grammar drafts too."""

    constraint: common_pb2.Constraint
    output_start: int  # the request's prompt length: the constrained output begins there


def _in_background(coroutine) -> None:
    """Run a stream's clean-up as a task, held strongly until it is done."""
    task = asyncio.get_running_loop().create_task(coroutine)
    _DRAINING.add(task)
    task.add_done_callback(_DRAINING.discard)


def _end(call) -> None:
    """Cancel a Propose call and release its request side. When the draft ended the call first, cancel() does
    nothing, and grpc.aio's proxy for call.write() (used when a channel has interceptors) would wait for a
    request forever; collected later, it logs "Task was destroyed but it is pending" and "aclose(): asynchronous
    generator is already running". Half-closing ends that proxy."""
    call.cancel()
    _in_background(_release_writes(call))


async def _release_writes(call) -> None:
    try:
        await asyncio.wait_for(call.done_writing(), 5.0)
    except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.TimeoutError, asyncio.InvalidStateError):
        pass  # the call is over either way


class DraftUnavailable(Exception):
    """The draft cannot serve this round; decode without it."""


# Opening a stream (the tokenizer check on a new channel, the start with the prompt) may take this long however short
# the rounds' floor (--draft-timeout-ms): connecting is not a round's wait, and with a floor of a few milliseconds a
# busy machine never opened a stream at all
OPEN_TIMEOUT_S = 1.0

# What a broken, slow or vanished stream raises: the round decodes without the draft.
STREAM_ERRORS = (grpc.aio.AioRpcError, asyncio.TimeoutError, asyncio.InvalidStateError, DraftUnavailable,
                 StreamEnded)


class DraftIncompatible(RuntimeError):
    """The draft's tokenizer differs from the target's; the message says what differs."""


# A draft that timed out this many rounds in a row is not asked for a while that grows with each further timeout
PATIENCE = 3
# ... up to this many times the wait each timeout cost: waiting on a draft that never answers then costs at most
# about 1 / WAITS_SKIPPED of the time, however long its waits
WAITS_SKIPPED = 64


class Backoff:
    """Exponential back-off between reconnection attempts, shared by all sequences.

    A failure backs off from initial_s, doubling up to maximum_s: a draft that restarts is asked again soon.
    A draft that times out PATIENCE rounds in a row (hung, or slower than any wait that pays) is not asked
    for 2, 4, 8, ... times the last wait, up to WAITS_SKIPPED times it: the rounds decode plainly meanwhile,
    and each retry costs one more wait. Any answer resets both."""

    def __init__(self, initial_s: float = 0.25, maximum_s: float = 5.0):
        self.initial_s, self.maximum_s = initial_s, maximum_s
        self.delay_s = 0.0
        self.retry_at = 0.0
        self.timeouts = 0  # rounds timed out in a row

    def ready(self) -> bool:
        return time.monotonic() >= self.retry_at

    def failed(self, waited_s: float = 0.0) -> None:
        """A draft call failed; waited_s > 0: it timed out after waiting that long."""
        self.delay_s = min(self.maximum_s, max(self.initial_s, self.delay_s * 2))
        if waited_s > 0:
            self.timeouts += 1
            if self.timeouts >= PATIENCE:
                self.delay_s = max(self.delay_s, waited_s * min(2 ** (self.timeouts - PATIENCE + 1), WAITS_SKIPPED))
        self.retry_at = time.monotonic() + self.delay_s

    def succeeded(self) -> None:
        self.delay_s, self.retry_at = 0.0, 0.0
        self.timeouts = 0


class DraftLink:
    def __init__(self, address: str, server_config: ServerConfig, target_info: common_pb2.ModelInfo,
                 timeout_s: float, pipeline: bool = True):
        self.address = address
        self.target_info = target_info
        self.timeout_s = timeout_s
        self.pipeline = pipeline  # ask the draft to draft ahead (draft_stream)
        self.channel = grpc_server.open_channel(address, server_config)
        self.stub = draft_pb2_grpc.DraftServiceStub(self.channel)
        self.backoff = Backoff()
        self.pace = DraftPace()  # the draft's measured answer time: how long a round waits for it
        self.checked = False  # tokenizer compatibility verified on this channel
        self.method = ""
        self.max_k = 0  # the largest block the draft serves (GetDraftInfo); 0: not reported
        self.sizes_blocks = False  # the draft cuts its blocks to its evidence (GetDraftInfo)
        self.sizes_some_blocks = False  # some of them, at no forward's cost: NextBlock.sized_only asks those (hybrid)
        # As one replica of a tier (specdec.runtime.peer_watch's member): its watch's verdict (None: live), the
        # draft's ModelInfo as last checked, and the sequences with a stream open on it
        self.problem: str | None = None
        self.info: common_pb2.ModelInfo | None = None
        self.outstanding = 0
        # Called when a call to it failed as if it went away: its watch takes it out and checks it at once.
        self.suspect: typing.Callable[[str], typing.Awaitable[None]] | None = None

    def opened(self, delta: int) -> None:
        """A sequence opened (1) or ended (-1) its stream on this draft."""
        self.outstanding += delta
        metrics.DRAFT_REPLICA_SEQUENCES.labels(replica=self.address).set(self.outstanding)

    async def check_compatible(self, wait_s: float = 0.0) -> common_pb2.ModelInfo:
        """Ask the draft for its tokenizer and refuse a mismatch (raises DraftIncompatible); its ModelInfo."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                reply = await self.stub.GetDraftInfo(draft_pb2.GetDraftInfoRequest(), timeout=5.0,
                                                     wait_for_ready=wait_s > 0)
                break
            except grpc.aio.AioRpcError as exc:
                if time.monotonic() >= deadline:
                    raise DraftUnavailable(f"draft at {self.address}: {exc.code().name}: {exc.details()}") from exc
                await asyncio.sleep(0.5)
        problem = models.tokenizer_mismatch(self.target_info, reply.info)
        if problem:
            raise DraftIncompatible(problem)
        self.method = reply.method
        self.max_k = reply.max_speculative_tokens
        self.sizes_blocks = reply.sizes_blocks
        self.sizes_some_blocks = reply.sizes_some_blocks
        self.checked = True
        return reply.info

    def available(self) -> bool:
        return self.backoff.ready()

    def session(self, request_id: str, sampling: SamplingParams, tenant: str = "",
                constraint: Constrained | None = None) -> DraftSession:
        """A handle for one sequence; its stream opens on the first proposal."""
        return DraftSession(self, request_id, sampling, tenant, constraint)

    async def open(self, request_id: str, tokens: list[int], sampling: SamplingParams, tenant: str = "",
                   constraint: Constrained | None = None):
        """Start a sequence on a new Propose stream and return the call. Raises DraftUnavailable (and backs off)."""
        try:
            if not self.checked:
                await asyncio.wait_for(self.check_compatible(), max(self.timeout_s, OPEN_TIMEOUT_S))
            call = self.stub.Propose()
            start = draft_pb2.StartSequence(
                request_id=request_id, prompt_token_ids=tokens, sampling=to_proto(sampling),
                # q serves rejection sampling only; a seeded request's coupled rule needs no q
                return_probs=not sampling.greedy and sampling.seed is None, tenant=tenant,
                max_context=self.target_info.max_context, pipeline=self.pipeline,
            )
            if constraint is not None:  # the grammar drafts too (the draft's --grammar-draft)
                start.constraint.CopyFrom(constraint.constraint)
                start.output_start = constraint.output_start
            try:
                await asyncio.wait_for(call.write(draft_pb2.ProposeRequest(start=start)),
                                       max(self.timeout_s, OPEN_TIMEOUT_S))
            except BaseException:  # failed, timed out or cancelled: the draft may hold the start; end the stream
                _end(call)
                raise
        except DraftIncompatible as exc:
            # a draft restarted with another tokenizer: never speculate with it; say so, and keep checking
            log.error("%s", exc)
            self.failed()
            raise DraftUnavailable(f"the draft at {self.address} is incompatible") from exc
        except STREAM_ERRORS as exc:
            self.failed(exc)
            raise DraftUnavailable(f"cannot open a draft stream: {exc!r}") from exc
        return call

    def failed(self, exc: BaseException | None = None, waited_s: float = 0.0) -> None:
        """A draft call failed (waited_s: a round's wait for a block that did not come). Back off (every sequence)
        unless the draft only refused this one request."""
        if isinstance(exc, grpc.aio.AioRpcError) and exc.code() in REQUEST_ERRORS:
            return
        self.backoff.failed(waited_s if isinstance(exc, asyncio.TimeoutError) else 0.0)
        self.checked = False  # whatever answers after a failure may be another draft: check its tokenizer again
        if self.suspect is not None and went_away(exc):
            reason = f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            _in_background(self.suspect(reason))

    async def close(self) -> None:
        await self.channel.close()


def went_away(exc: BaseException | None) -> bool:
    """Whether a failure looks like the draft is gone (not slow, not refusing one request): unreachable, or its
    connection dropped. A tier then routes around it at once, without waiting for its next check."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code() == grpc.StatusCode.UNAVAILABLE
    return isinstance(exc, DraftUnavailable)


class Router(typing.Protocol):
    """Where a sequence's stream opens: the draft tier (verifier_service.draft.tier.DraftTier)."""

    def route(self, session: DraftSession) -> DraftLink | None: ...


class DraftSession:
    """One sequence's handle on the draft: its stream (opened on first use) and its position in the draft.

    The draft's copy of the sequence is kept in step with the verifier's by position: `synced`
    tokens are known to be identical on both sides. Each round sends only what changed since
    (roll back to `synced`, append the tokens after it) and asks for the next block; the block may
    have come ahead, drafted while the previous round was verified (`draft_stream`).
    """

    def __init__(self, link: DraftLink, request_id: str, sampling: SamplingParams, tenant: str = "",
                 constraint: Constrained | None = None, router: Router | None = None):
        self.link = link  # the replica of the stream (the last one opened), or the one it would open on
        self.router = router  # several replicas: asked for the replica each time a stream opens
        self.request_id = request_id
        self.sampling = sampling
        self.tenant = tenant
        self.constraint = constraint
        self.stream: ProposeStream | None = None  # the Propose stream, once opened
        self.synced = 0  # tokens[:synced] are known to be identical in the draft
        self.ahead = AheadCounts()
        # an unanswered prefetch: (round, tokens before it, k asked, when it was asked: None for a stream's first ask,
        # whose answer time is mostly the prompt's)
        self.prefetched: tuple[int, int, int, float | None] | None = None
        # The stream's first round timed out while the draft read the prompt: its answer is taken as a prefetch's when
        # it comes (`at_hand`), and no round waits for it meanwhile (each decodes a plain step)
        self.reading_prompt = False
        # The last prefetch's answer time, for the draft's pace (`RequestSpeculation.record`): (k asked, seconds from
        # the ask to its answer or to giving up on it, answered, the answer was sized by the draft's evidence)
        self.prefetch_timing: tuple[int, float, bool, bool] | None = None

    @property
    def call(self):
        return self.stream.call if self.stream is not None else None

    async def _ensure_stream(self, tokens: list[int]) -> str:
        """Open the Propose stream on first use; "" when it is open, else why the round has no draft."""
        if self.stream is not None:
            return ""
        if self.router is not None:
            link = self.router.route(self)
            if link is None:
                return "unavailable"
            self.link = link
        if not self.link.available():
            return "backoff"
        link = self.link
        try:
            call = await link.open(self.request_id, tokens, self.sampling, self.tenant, self.constraint)
        except DraftUnavailable as exc:
            log.warning("request %s: decoding without the draft: %s", self.request_id, exc)
            return "unavailable"
        self.stream = ProposeStream(call, self.ahead)
        link.opened(1)
        self.synced = len(tokens)
        return ""

    async def propose(self, tokens: list[int], k: int, wait_s: float | None = None,
                      sized_only: bool = False, min_sized: int = 0, opening: bool = False) -> tuple[DraftBlock, str]:
        """A block of up to k tokens after `tokens`, or an empty one and the reason it is empty ("timeout": no
        answer within wait_s, by default the link's timeout). sized_only: only a block the draft sizes at no
        forward's cost, or none (NextBlock.sized_only; on a pipelined stream nothing is drafted ahead after it).
        min_sized: the shortest match at which such a block answers rather than the model's (NextBlock.min_sized).
        opening: the draft reads the sequence before it answers, on an open stream too (the hybrid's model, which
        reads it when it first drafts): a timeout then keeps the stream and takes the answer when it comes
        (`_read_prompt_behind`), as on a stream's first round. Ended instead, the next ask read it all again."""
        wait_s = self.link.timeout_s if wait_s is None else wait_s
        opening = opening or self.stream is None
        reason = await self._ensure_stream(tokens)
        if reason:
            return DraftBlock.empty(), reason
        self.prefetched = None
        if self.link.max_k:
            k = min(k, self.link.max_k)  # the draft refuses larger blocks (its --max-speculative-tokens)
        stream = self.stream
        try:
            response, ahead = await asyncio.wait_for(
                stream.next_block(self.synced, tokens[self.synced:], k, sized_only, min_sized), wait_s)
        except STREAM_ERRORS as exc:
            if opening and isinstance(exc, asyncio.TimeoutError) and self.stream is stream:
                return DraftBlock.empty(), self._read_prompt_behind(stream, tokens, k, wait_s)
            return DraftBlock.empty(), self._round_failed(stream, exc, wait_s)
        self.synced = len(tokens)
        if response.answered_ahead:  # the draft answered with a block sent ahead, which was discarded here
            return DraftBlock.empty(), "ahead_discarded"
        try:
            block = self._block(response, k, ahead)
        except DraftUnavailable as exc:
            if ahead:  # the draft answered this round with it: verify no block, the next sync rolls it back
                self.ahead.discard("invalid")
                return DraftBlock.empty(), "ahead_invalid"
            return self._give_up(str(exc))
        if ahead:
            self.ahead.use()
        self.link.backoff.succeeded()
        return block, ""

    def ahead_ready(self, tokens: list[int]) -> bool:
        """Whether the draft's block drafted ahead for `tokens` has arrived (propose would use it at once)."""
        return self.stream is not None and self.stream.ahead_ready(self.synced, tokens[self.synced:])

    async def prefetch(self, tokens: list[int], k: int, min_sized: int = 0) -> str:
        """Ask for a block after `tokens` without waiting: the verifier decodes a plain step meanwhile, and the
        next round finds the answer (`at_hand`). One token more than k is asked, so that the block still holds
        k after the plain step's token, if the draft guessed that token (min_sized: as `propose`'s). "" or why
        nothing was asked."""
        reason = await self._ensure_stream(tokens)
        if reason:
            return reason
        k = min(k + 1, self.link.max_k) if self.link.max_k else k + 1
        stream = self.stream
        try:
            round_ = await asyncio.wait_for(stream.send(self.synced, tokens[self.synced:], k, min_sized=min_sized),
                                            self.link.timeout_s)
        except STREAM_ERRORS as exc:
            return self._round_failed(stream, exc)
        self.synced = len(tokens)
        self.prefetched = (round_, len(tokens), k, time.perf_counter())
        return ""

    async def at_hand(self, tokens: list[int], k: int,
                      wait_s: float | None = None) -> tuple[DraftBlock | None, bool | None]:
        """The answer to the last prefetch, as a block of up to k tokens after `tokens`, if the tokens decoded since
        it was asked are its first ones (it was drafted after tokens[:base]; the block is what follows tokens[base:]
        in it). A draft slower than the plain step is waited for here, for what is left of its time. (block or
        None, whether its first token was the target's: None when nothing was judged). A block is never used
        after tokens it did not assume. wait_s: how long the answer may take (default: the link's timeout)."""
        if self.prefetched is None or self.stream is None:
            return None, None
        stream = self.stream
        if self.reading_prompt:
            try:
                if not stream.has_answer(self.prefetched[0]):
                    return None, None  # still reading the prompt: this round decodes a plain step
            except STREAM_ERRORS as exc:
                self.reading_prompt = False
                self._round_failed(stream, exc)
                return None, None
            self.reading_prompt = False
            self.link.backoff.succeeded()  # the draft was slow to read a long prompt, not gone
        (round_, base, asked, sent_at), self.prefetched = self.prefetched, None
        wait_s = self.link.timeout_s if wait_s is None else wait_s
        try:
            response = await asyncio.wait_for(stream.answer(round_), wait_s)
        except STREAM_ERRORS as exc:
            if sent_at is not None and isinstance(exc, asyncio.TimeoutError):
                self.prefetch_timing = (asked, time.perf_counter() - sent_at, False, False)
            self._round_failed(stream, exc, wait_s)
            return None, None
        if sent_at is not None:
            self.prefetch_timing = (asked, time.perf_counter() - sent_at, True, response.sized_by_draft)
        proposed, decoded = list(response.token_ids), tokens[base:]
        if not decoded or not proposed:
            return None, None
        if len(proposed) > asked and not self._sized(response):
            log.warning("request %s: the draft answered %d tokens where %d were asked", self.request_id,
                        len(proposed), asked)
            self.ahead.prefetch("invalid")
            return None, None
        if len(decoded) >= len(proposed) or proposed[:len(decoded)] != decoded:
            self.ahead.prefetch("missed")
            return None, proposed[0] == decoded[0]
        try:
            block = self._block(response, k, ahead=True, offset=len(decoded))
        except DraftUnavailable as exc:
            log.warning("request %s: dropped a prefetched block: %s", self.request_id, exc)
            self.ahead.prefetch("invalid")
            return None, None
        self.synced = base + len(decoded)  # the draft holds tokens[:base] + its proposal, which begins with these
        self.ahead.prefetch("used")
        self.link.backoff.succeeded()
        return block, True

    def _read_prompt_behind(self, stream: ProposeStream, tokens: list[int], k: int, waited_s: float) -> str:
        """The stream's first round had no answer within waited_s: the draft is still reading the prompt (a long one
        costs a model draft a prefill). Ending the stream would throw that prefill away, and every retry would start
        it over, so a prompt longer than the draft reads in one wait would never be drafted for. So the stream is
        kept, and the round's answer is taken when it comes, as a prefetched block's: the sync it answers was sent,
        so the draft then holds tokens + its block. The timeout still counts against the link (a draft that never
        answers backs off other sequences); the answer, when it comes, clears it."""
        self.link.failed(asyncio.TimeoutError(), waited_s)
        self.synced = len(tokens)
        self.prefetched = (stream.round, len(tokens), k, None)  # its answer time does not time the draft's blocks
        self.reading_prompt = True
        log.info("request %s: the draft is still reading the prompt after %.0f ms; decoding plainly until it answers",
                 self.request_id, waited_s * 1000)
        return "timeout"

    def _round_failed(self, stream: ProposeStream, exc: BaseException, waited_s: float = 0.0) -> str:
        """A call on `stream` raised: "closed" if the sequence ended (and closed its stream) meanwhile; else back
        off and end the stream ("timeout" after waited_s without an answer, else "failed"), so the next round opens
        a new one."""
        if self.stream is not stream:
            return "closed"
        self.link.failed(exc, waited_s)
        if isinstance(exc, asyncio.TimeoutError):
            self._give_up(f"no block within {waited_s * 1000:.0f} ms")
            return "timeout"
        return self._give_up(f"draft round failed: {exc!r}")[1]

    def _give_up(self, why: str) -> tuple[DraftBlock, str]:
        """End this stream; the next round opens a new one (after the link's back-off, if any)."""
        log.warning("request %s: decoding without the draft: %s", self.request_id, why)
        self.cancel()
        return DraftBlock.empty(), "failed"

    def accepted(self, num_accepted: int) -> None:
        """The verifier kept the last block up to num_accepted tokens: the draft holds those too."""
        self.synced += num_accepted

    def _sized(self, response: draft_pb2.ProposeResponse) -> bool:
        """Whether the draft sized this block by its evidence, within its own limit: then it may be longer than asked."""
        return response.sized_by_draft and len(response.token_ids) <= self.link.max_k

    def _block(self, response: draft_pb2.ProposeResponse, k: int, ahead: bool = False, offset: int = 0) -> DraftBlock:
        """The response as a block of at most k tokens, from its token `offset` on (a prefetched block, after the
        tokens decoded meanwhile). An ahead or prefetched block was drafted before k was known and may be longer:
        its first k tokens are a block for this round (q of each is conditioned on those before). A block the draft
        sized by its evidence (`sized_by_draft`) may be longer than k, up to the draft's own limit, and is kept whole:
        the policy cuts it to what pays."""
        tokens = list(response.token_ids)
        vocab = self.link.target_info.vocab_size
        sized = self._sized(response)
        if (len(tokens) > k and not ahead and not sized) or any(t < 0 or t >= vocab for t in tokens):
            raise DraftUnavailable(f"the draft sent an invalid block {tokens[:8]} for k={k}")
        if response.num_chained + response.num_forced > len(tokens):
            raise DraftUnavailable(f"the draft said {response.num_chained} chained and {response.num_forced} forced "
                                   f"of its {len(tokens)} tokens")
        block = DraftBlock(tokens, None, ahead, response.num_chained, response.num_forced,
                           sized).window(offset, len(tokens) - offset if sized else k)
        if not response.probs:
            return block
        probs = np.frombuffer(response.probs, dtype="<f4")
        if probs.size % max(len(tokens), 1) or not tokens:
            raise DraftUnavailable("the draft sent probabilities that do not match its tokens")
        rows = probs.reshape(len(tokens), -1)[offset:offset + len(block.token_ids)]  # q of the block's tokens only
        q = torch.from_numpy(rows.copy())  # [k', V_draft]
        if q.shape[1] < vocab:  # a draft with a narrower output layer: pad q with zeros
            q = torch.nn.functional.pad(q, (0, vocab - q.shape[1]))
        return dataclasses.replace(block, probs=q[:, :vocab])

    def cancel(self) -> None:
        self.prefetched = None
        self.reading_prompt = False
        if self.stream is not None:
            _end(self.stream.call)
            self.stream = None
            self.link.opened(-1)

    def close(self, final_tokens: list[int] | None = None) -> None:
        """End the stream. After a normal finish (final_tokens: the whole sequence), sync the draft to it
        and half-close, so the draft finishes the call cleanly and may learn the output; after a cancel or
        failure (None), cancel it, so the draft keeps nothing. Runs in the background."""
        if self.stream is None:
            return
        if final_tokens is None:
            self.cancel()
            return
        stream, self.stream = self.stream, None
        self.link.opened(-1)
        _in_background(self._drain(stream, self.synced, final_tokens[self.synced:]))

    @staticmethod
    async def _drain(stream: ProposeStream, keep_length: int, append_token_ids: list[int]) -> None:
        try:
            await stream.finish(keep_length, append_token_ids)
        except (grpc.aio.AioRpcError, asyncio.TimeoutError, asyncio.InvalidStateError, RuntimeError):
            _end(stream.call)
