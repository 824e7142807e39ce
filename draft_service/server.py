"""DraftService: one bidirectional Propose stream per sequence.

The stream's first message opens the sequence; each later message rolls it back
to what the verifier kept, appends the target's token(s), and asks for the next
block. The sequence lives exactly as long as its stream, so a caller that goes
away frees it, and a stream that sends nothing for --sequence-ttl-s is ended
(ABORTED), so idle streams cannot hold the --max-sequences slots. A sequence
never grows past the target's context (StartSequence.max_context), checked
before any work.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import time

import grpc
from opentelemetry import trace

from draft_service.ahead import Block, DraftAhead
from draft_service.config import DraftConfig
from draft_service.faults import inject_ahead_fault, inject_draft_token
from draft_service.proposer import DraftSequence, Proposer, ProposerError
from specdec.decoding.draft_block import DraftBlock
from specdec.decoding.grammar import constraint_set
from specdec.runtime import limits
from specdec.runtime import metrics
from specdec.decoding.sampling import from_proto
from specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc

log = logging.getLogger(__name__)


class DraftServicer(draft_pb2_grpc.DraftServiceServicer):
    def __init__(self, proposer: Proposer, info: common_pb2.ModelInfo, config: DraftConfig):
        self.proposer = proposer
        self.info = info
        self.config = config
        self.live: dict[int, DraftSequence] = {}
        self._compute = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="draft-compute")

    async def GetDraftInfo(self, request, context):
        return draft_pb2.GetDraftInfoResponse(info=self.info, method=self.proposer.method,
                                              max_speculative_tokens=self.config.max_speculative_tokens,
                                              sizes_blocks=self.proposer.sizes_blocks,
                                              sizes_some_blocks=self.proposer.sizes_some_blocks)

    async def Propose(self, request_iterator, context: grpc.aio.ServicerContext):
        requests = aiter(request_iterator)
        first = await self._receive(requests, context, "")
        if first is None:
            return
        if first.WhichOneof("kind") != "start":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first Propose message must be `start`")
        start = first.start
        longest = self._max_tokens(start.max_context)
        problem = self._check_start(start, longest)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        if len(self.live) >= self.config.max_sequences:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"the draft holds {len(self.live)} live sequences, its cap (--max-sequences); retry later")
        sampling = from_proto(start.sampling)
        opener = self.proposer.start
        if self.proposer.takes_constraints and constraint_set(start.constraint):  # the grammar drafts too
            opener = functools.partial(self.proposer.start, constraint=start.constraint,
                                       output_start=start.output_start or None, request_id=start.request_id)
        try:
            sequence = await self._run(opener, list(start.prompt_token_ids), sampling, start.return_probs,
                                       start.tenant)
        except (ValueError, RuntimeError, ProposerError) as exc:  # e.g. a seed the generator cannot take
            log.warning("request %s: cannot start a draft sequence: %s", start.request_id, exc)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"start: cannot start the sequence: {exc}")
        key = id(sequence)
        self.live[key] = sequence
        metrics.LIVE_SEQUENCES.set(len(self.live))
        ahead = DraftAhead(self.config.max_speculative_tokens) if start.pipeline and self._ahead_pays() else None
        try:
            while (request := await self._receive(requests, context, start.request_id)) is not None:
                if request.WhichOneof("kind") != "next":
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "after `start`, send only `next` messages")
                sync = request.next
                await self._check_next(sequence, sync, context, longest, ahead)
                if ahead is not None and ahead.sync(sync):
                    # the block sent ahead answers this round: confirm it (the verifier needs nothing else), and
                    # the assumed sync it rested on is now the target's
                    await self._run(sequence.confirm, sync.keep_length + len(sync.append_token_ids))
                    yield draft_pb2.ProposeResponse(round=sync.round, answered_ahead=True,
                                                    sequence_length=len(sequence.tokens))
                else:
                    yield await self._answer(sequence, sync, context, longest, ahead)
                if ahead is not None and sync.num_tokens and not sync.sized_only:  # (sized-only: no model drafts)
                    for message in await self._ahead(sequence, ahead, longest, context):
                        yield message
            sequence.finish()  # the verifier half-closed the stream: the sequence ended normally
        finally:
            del self.live[key]
            metrics.LIVE_SEQUENCES.set(len(self.live))
            sequence.close()

    def _ahead_pays(self) -> bool:
        """--propose-ahead: a proposer that runs on the compute thread (a model) drafts ahead only when told to."""
        mode = self.config.propose_ahead
        return mode == "always" or (mode == "cheap" and self.proposer.inline)

    async def _receive(self, requests, context, request_id: str):
        """The stream's next message, or None at its end. A stream idle past --sequence-ttl-s is ended."""
        ttl_s = self.config.sequence_ttl_s
        try:
            return await asyncio.wait_for(anext(requests, None), ttl_s if ttl_s > 0 else None)
        except asyncio.TimeoutError:
            log.warning("request %s: no message for %g s (--sequence-ttl-s): dropping its draft sequence",
                        request_id, ttl_s)
            await context.abort(grpc.StatusCode.ABORTED,
                                f"the draft dropped this stream: no message for {ttl_s:g} s (its --sequence-ttl-s); "
                                "open a new stream")

    async def _check_next(self, sequence: DraftSequence, block: draft_pb2.NextBlock, context, longest: int,
                          ahead: DraftAhead | None) -> None:
        """A sync at the boundary: sizes, ids, positions and (pipelined) the round number, before any work."""
        if block.num_tokens > self.config.max_speculative_tokens:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"num_tokens {block.num_tokens} exceeds --max-speculative-tokens "
                                f"{self.config.max_speculative_tokens}")
        problems = limits.token_ids_problems(list(block.append_token_ids), self.info.vocab_size,
                                             "next.append_token_ids")
        if problems:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "; ".join(problems))
        if block.keep_length > len(sequence.tokens):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"next.keep_length {block.keep_length} is past the draft's sequence of "
                                f"{len(sequence.tokens)} tokens: sync from a position the draft has")
        if block.keep_length + len(block.append_token_ids) + block.num_tokens > longest:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE,
                                f"next: keep_length {block.keep_length} + {len(block.append_token_ids)} "
                                f"append_token_ids + num_tokens {block.num_tokens} exceeds the draft's limit of "
                                f"{longest} tokens per sequence")
        if ahead is not None and block.round != ahead.round + 1:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"next.round {block.round}: expected {ahead.round + 1} (with start.pipeline, "
                                "rounds are numbered 1, 2, 3, ...)")

    async def _answer(self, sequence: DraftSequence, block: draft_pb2.NextBlock, context, longest: int,
                      ahead: DraftAhead | None) -> draft_pb2.ProposeResponse:
        """Roll back, append, propose: the round's block. Pipelined, one token more is proposed than sent:
        the draft's guess of the target's next token, which the block drafted ahead assumes (not for a sized-only
        ask, after which nothing is drafted ahead: that would run the model the verifier chose not to)."""
        k = block.num_tokens
        guess = 1 if ahead is not None and k and not block.sized_only \
            and block.keep_length + len(block.append_token_ids) + k < longest else 0
        proposal = await self._propose(sequence, block.keep_length, list(block.append_token_ids), k + guess if k else 0,
                                       context, k, sized_only=block.sized_only, min_sized=block.min_sized)
        if ahead is not None:
            ahead.answered(Block(len(sequence.tokens) - len(proposal.token_ids), list(proposal.token_ids), k))
        return inject_draft_token(self.config.inject_draft_token,
                                  self._response(proposal, k, block.round, len(sequence.tokens),
                                                 sized_ok=ahead is None or block.sized_only))

    async def _ahead(self, sequence: DraftSequence, ahead: DraftAhead, longest: int,
                     context) -> list[draft_pb2.ProposeResponse]:
        """The block for the next round if the verifier accepts this one whole, drafted now and sent unasked."""
        plan = ahead.next_ahead(longest)
        if plan is None:
            return []
        keep, append, k = plan
        proposal = await self._propose(sequence, keep, append, k + 1, context, k, assumed=True)
        if not proposal.token_ids:
            return []
        ahead.sent(keep, append, Block(keep + len(append), list(proposal.token_ids), k))
        message = inject_draft_token(self.config.inject_draft_token,
                                     self._response(proposal, k, ahead.round + 1, len(sequence.tokens)))
        message.ahead.keep_length, message.ahead.append_token_ids[:] = keep, append
        return inject_ahead_fault(self.config.inject_ahead_fault, message, self.info.vocab_size)

    async def _propose(self, sequence: DraftSequence, keep: int, append: list[int], n: int, context,
                       k: int, assumed: bool = False, sized_only: bool = False,
                       min_sized: int | None = None) -> DraftBlock:
        if self.config.inject_delay_ms:
            await asyncio.sleep(self.config.inject_delay_ms / 1000)
        started = time.perf_counter()
        try:
            proposal = await self._run(self._step, sequence, keep, append, n, assumed, sized_only, min_sized)
        except ProposerError as exc:  # the proposer's own refusal
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"next: {exc}")
        event = {"k": k, "proposed": min(k, len(proposal.token_ids)),
                 "ms": round((time.perf_counter() - started) * 1000, 3)}
        if sequence.source:  # hybrid: the side that drafted the block
            event["source"] = sequence.source
        if min_sized:  # the verifier's threshold for the suffix side (NextBlock.min_sized)
            event["min_sized"] = min_sized
        trace.get_current_span().add_event("propose", event)
        return proposal

    @staticmethod
    def _response(proposal: DraftBlock, k: int, round_: int, sequence_length: int,
                  sized_ok: bool = False) -> draft_pb2.ProposeResponse:
        """The first k proposed tokens (and their q) as a message; all of them, where the proposer sized the block by
        its evidence and the stream is not pipelined (sized_ok: a block drafted ahead assumes the one before it was
        exactly as long as asked)."""
        sized = proposal.sized_by_draft and sized_ok
        proposal = proposal if sized else proposal.cut(k)
        metrics.DRAFT_TOKENS_PROPOSED.inc(len(proposal.token_ids))
        probs = b"" if proposal.probs is None else proposal.probs.numpy().astype("<f4", copy=False).tobytes()
        return draft_pb2.ProposeResponse(token_ids=proposal.token_ids, probs=probs, sequence_length=sequence_length,
                                         round=round_, num_chained=proposal.num_chained,
                                         num_forced=proposal.num_forced, sized_by_draft=sized)

    @staticmethod
    def _step(sequence: DraftSequence, keep_length: int, append: list[int], n: int, assumed: bool,
              sized_only: bool = False, min_sized: int | None = None) -> DraftBlock:
        """Sync, then propose n tokens; min_sized: the round's NextBlock.min_sized (None, drafting ahead: the last)."""
        sequence.update(keep_length, append, assumed)
        if min_sized is not None:
            sequence.set_min_sized(min_sized)
        if not n:
            return DraftBlock.empty()
        return sequence.propose_sized(n) if sized_only else sequence.propose(n)

    async def _run(self, fn, *args):
        """Cheap proposers run on the event loop; model proposers on the compute thread."""
        if self.proposer.inline:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._compute, fn, *args)

    def _max_tokens(self, target_context: int) -> int:
        """Longest sequence the draft keeps for a stream: the target's context (start.max_context), its own
        model's, whichever is shorter; a fixed bound where neither is known."""
        known = [n for n in (target_context, self.info.max_context) if n]
        return min(known) if known else limits.MAX_DRAFT_SEQUENCE_TOKENS

    def _check_start(self, start: draft_pb2.StartSequence, longest: int) -> str | None:
        """Sizes first (before looking at each id), then the ids, the sampling and the client's strings."""
        if not start.prompt_token_ids:
            return "start.prompt_token_ids must not be empty"
        if len(start.prompt_token_ids) > longest:
            return (f"start.prompt_token_ids has {len(start.prompt_token_ids)} tokens; the draft keeps at most "
                    f"{longest} (start.max_context {start.max_context}, the draft's own limit "
                    f"{self.info.max_context or limits.MAX_DRAFT_SEQUENCE_TOKENS})")
        problems = limits.token_ids_problems(list(start.prompt_token_ids), self.info.vocab_size,
                                             "start.prompt_token_ids")
        problems += [f"start.sampling.{p}" for p in from_proto(start.sampling).problems()]
        problems += limits.text_problems(start.request_id, "start.request_id", limits.MAX_REQUEST_ID_LENGTH)
        problems += limits.text_problems(start.tenant, "start.tenant", limits.MAX_TENANT_LENGTH)
        if start.output_start > len(start.prompt_token_ids):
            problems.append(f"start.output_start {start.output_start} is past the {len(start.prompt_token_ids)} "
                            "prompt tokens: it is where the request's output begins among them")
        return "; ".join(problems) or None
