"""DraftLink against a real (in-process) draft: the two sides agree on limits, and a failed stream leaves
nothing pending behind it."""

from __future__ import annotations

import asyncio
import gc

from specdec.runtime.config import ServerConfig
from specdec.decoding.sampling import SamplingParams
from specdec.v1 import common_pb2
from tests.draft_service.inprocess import INFO, draft_server
from tests.log_records import asyncio_messages
from verifier_service.draft.client import DraftLink


def target(max_context: int = 512) -> common_pb2.ModelInfo:
    info = common_pb2.ModelInfo()
    info.CopyFrom(INFO)
    info.max_context = max_context
    return info


def pending_request_pollers() -> list[asyncio.Task]:
    """grpc.aio's tasks that feed a stream call's requests and were never finished."""
    return [task for task in asyncio.all_tasks() if not task.done()
            and "_consume_request_iterator" in repr(task.get_coro())]


def test_k_is_capped_at_the_drafts_largest_block():
    """Verifier max k 64, draft max 8: a k=40 round gets a block of at most 8, not a refusal and a fallback."""

    async def scenario():
        async with draft_server(max_speculative_tokens=8) as (address, _):
            link = DraftLink(address, ServerConfig(), target(), timeout_s=5.0)
            await link.check_compatible(wait_s=5.0)
            assert link.max_k == 8
            session = link.session("r", SamplingParams())
            tokens = list(range(1, 30)) * 3  # a repeat: n-gram lookup proposes the rest of it
            for _ in range(3):
                block, reason = await session.propose(tokens, 40)
                assert reason == "" and 1 <= len(block.token_ids) <= 8, (reason, block.token_ids)
                session.accepted(len(block.token_ids))
                tokens += block.token_ids
            session.close(tokens)
            await link.close()

    asyncio.run(scenario())


def test_the_draft_learns_the_targets_context_and_a_refused_stream_leaves_nothing_pending(caplog):
    async def scenario():
        async with draft_server() as (address, servicer):
            link = DraftLink(address, ServerConfig(), target(max_context=16), timeout_s=5.0)
            session = link.session("r", SamplingParams())
            # StartSequence.max_context carried the target's 16: the draft takes a 12-token prompt, but refuses a
            # round that could grow the sequence to 12 + 8 tokens (OUT_OF_RANGE)
            block, reason = await session.propose(list(range(12)), 8)
            assert block.token_ids == [] and reason == "failed"
            assert link.available(), "a refusal about one request must not back off the others"
            # the call ended on the draft's side; its request feeder must not be left waiting forever (collected
            # later, it logged "Task was destroyed but it is pending" and "aclose(): ... already running")
            for _ in range(50):
                await asyncio.sleep(0.02)
                if not pending_request_pollers():
                    break
            assert pending_request_pollers() == []
            assert servicer.live == {}
            # within the context, the same link speculates
            block, reason = await link.session("r2", SamplingParams()).propose([1, 2, 3, 1, 2], 2)
            assert reason == "" and block.token_ids == [3, 1]
            await link.close()

    gc.disable()  # the garbage collector would hide a pending task (all_tasks() holds tasks weakly)
    try:
        asyncio.run(scenario())
    finally:
        gc.enable()
    gc.collect()
    assert asyncio_messages(caplog.records) == []


def test_a_request_cancelled_while_its_stream_opens_leaves_no_sequence_on_the_draft():
    """Cancel a proposal at every point of opening its stream: the draft must not keep a sequence the verifier
    no longer knows about (before, one that had received its `start` stayed until the draft's TTL)."""

    async def scenario():
        async with draft_server() as (address, servicer):
            link = DraftLink(address, ServerConfig(), target(), timeout_s=5.0)
            await link.check_compatible(wait_s=5.0)
            for delay in range(40):
                session = link.session(f"r{delay}", SamplingParams())
                task = asyncio.get_running_loop().create_task(session.propose([1, 2, 3, 1, 2], 2))
                for _ in range(delay):
                    await asyncio.sleep(0)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                session.close(None)
            for _ in range(100):
                if not servicer.live:
                    break
                await asyncio.sleep(0.02)
            assert servicer.live == {}
            await link.close()

    gc.disable()  # the collector would end a forgotten call eventually; the test wants it ended at once
    try:
        asyncio.run(scenario())
    finally:
        gc.enable()
