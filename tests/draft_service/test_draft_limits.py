"""The draft's limits hold before it does any work: the target's context caps a sequence, idle streams are
dropped after --sequence-ttl-s, and GetDraftInfo reports the largest block it serves."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from specdec.runtime import limits
from specdec.v1 import draft_pb2, draft_pb2_grpc
from tests.draft_service.inprocess import draft_server
from tests.grpc_streams import replies

P = draft_pb2.ProposeRequest


def start(prompt, max_context=0, request_id="r"):
    return P(start=draft_pb2.StartSequence(request_id=request_id, prompt_token_ids=list(prompt),
                                           max_context=max_context))


def nxt(keep, append=(), k=2):
    return P(next=draft_pb2.NextBlock(keep_length=keep, append_token_ids=list(append), num_tokens=k))


async def propose(address, messages, timeout=30.0):
    """The replies to `messages` on one Propose stream; raises AioRpcError with the draft's status if it ends the call."""
    async with grpc.aio.insecure_channel(address) as channel:
        return await replies(draft_pb2_grpc.DraftServiceStub(channel).Propose(timeout=timeout), messages)


def test_the_targets_context_caps_the_sequence_before_any_work():
    async def scenario():
        async with draft_server() as (address, _):
            # the verifier's context (start.max_context) bounds the prompt...
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await propose(address, [start([5] * 600, max_context=512)])
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "keeps at most 512" in raised.value.details() and "start.max_context 512" in raised.value.details()
            # ...and every later round
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await propose(address, [start([5] * 500, max_context=512), nxt(500, [6] * 10, 4)])
            assert raised.value.code() == grpc.StatusCode.OUT_OF_RANGE
            assert "limit of 512 tokens" in raised.value.details()
            # within it, the stream works
            replies = await propose(address, [start([1, 2, 3, 1, 2], max_context=512), nxt(5, [], 2)])
            assert [list(r.token_ids) for r in replies] == [[3, 1]]
            # a caller that sends no context (an older verifier) meets the draft's own bound, checked before the
            # ids are looked at: refused fast, not after indexing 2^20 tokens on the event loop
            huge = [5] * (1 << 20)
            started = time.perf_counter()
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await propose(address, [start(huge)])
            seconds = time.perf_counter() - started
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"keeps at most {limits.MAX_DRAFT_SEQUENCE_TOKENS}" in raised.value.details()
            print(f"figure: a 2^20-token start is refused in {seconds * 1000:.0f} ms")
            assert seconds < 5.0

    asyncio.run(scenario())


def test_idle_streams_are_dropped_after_the_ttl_and_free_their_slots():
    """Streams that only send `start` hold --max-sequences slots for --sequence-ttl-s, not forever."""

    async def scenario():
        async with draft_server(max_sequences=2, sequence_ttl_s=0.5) as (address, servicer):
            async with grpc.aio.insecure_channel(address) as channel:
                stub = draft_pb2_grpc.DraftServiceStub(channel)
                idle = [stub.Propose() for _ in range(2)]
                for call in idle:
                    await call.write(start([1, 2, 3]))
                while len(servicer.live) < 2:
                    await asyncio.sleep(0.01)
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await propose(address, [start([1, 2, 3]), nxt(3)])
                assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                for call in idle:  # ended by the draft, with a status that says why
                    assert await call.code() == grpc.StatusCode.ABORTED
                    assert "--sequence-ttl-s" in await call.details()
                # The status reaches the client before the draft's handler has run its cleanup (same event loop
                # here; one make test read one slot still held): the slots are freed promptly, not at once.
                for _ in range(200):
                    if not servicer.live:
                        break
                    await asyncio.sleep(0.01)
                assert servicer.live == {}
                replies = await propose(address, [start([1, 2, 3, 1, 2]), nxt(5)])
                assert [list(r.token_ids) for r in replies] == [[3, 1]]
                # a stream that keeps talking is not idle, however long it lives
                call = stub.Propose()
                await call.write(start([1, 2, 3, 1, 2]))
                for _ in range(4):
                    await asyncio.sleep(0.3)
                    await call.write(nxt(5, [], 0))
                    assert (await call.read()).sequence_length == 5
                await call.done_writing()
                assert await call.code() == grpc.StatusCode.OK

    asyncio.run(scenario())


def test_draft_info_reports_the_largest_block():
    async def scenario():
        async with draft_server(max_speculative_tokens=8) as (address, _):
            async with grpc.aio.insecure_channel(address) as channel:
                info = await draft_pb2_grpc.DraftServiceStub(channel).GetDraftInfo(draft_pb2.GetDraftInfoRequest())
            assert info.max_speculative_tokens == 8 and info.method == "ngram" and not info.sizes_blocks

    asyncio.run(scenario())


def test_a_suffix_draft_says_it_sizes_its_own_blocks_and_the_verifiers_link_reads_it():
    from draft_service.suffix import SuffixProposer
    from specdec.runtime.config import ServerConfig
    from tests.draft_service.inprocess import INFO
    from verifier_service.draft.client import DraftLink

    async def scenario():
        async with draft_server(proposer=SuffixProposer()) as (address, _):
            link = DraftLink(address, ServerConfig(), INFO, timeout_s=5.0)
            await link.check_compatible()
            assert link.method == "suffix" and link.sizes_blocks

    asyncio.run(scenario())


@pytest.mark.parametrize("field,value", [("request_id", "ok\n2026-01-01 CRITICAL forged"), ("tenant", "t\r\x1b[2J"),
                                         ("request_id", "x" * 129)])
def test_client_strings_that_would_reach_a_log_are_refused(field, value):
    async def scenario():
        async with draft_server() as (address, _):
            message = start([1, 2, 3])
            setattr(message.start, field, value)
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await propose(address, [message])
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"start.{field}" in raised.value.details()

    asyncio.run(scenario())


def test_bad_syncs_are_invalid_argument_and_nothing_enters_the_suffix_cache():
    """Issue 15's bad input: a sync with ids outside the vocabulary, or a keep_length past the sequence, ends
    the stream with INVALID_ARGUMENT, and the request's tokens never reach the global tree."""
    from draft_service.suffix import SuffixProposer

    proposer = SuffixProposer()

    async def scenario():
        async with draft_server(proposer=proposer) as (address, _):
            for bad, field in ([nxt(5, [1, 2, 500], 2), "append_token_ids"], [nxt(6, [1], 2), "keep_length"]):
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await propose(address, [start([1, 2, 3, 1, 2]), bad, nxt(0, [], 0)])
                assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value.details()
                assert field in raised.value.details()
            # a good stream that ends normally is cached: the bad ones were not
            await propose(address, [start([1, 2, 3, 1, 2]), nxt(5, [3, 4], 2), nxt(7, [9], 0)])

    asyncio.run(scenario())
    assert proposer.cache.cached_requests == 1, proposer.cache.outputs("")
