"""A draft stream that ends under the verifier gives the round an empty block, never an error for the client."""

import asyncio

from specdec.runtime.config import ServerConfig
from specdec.decoding.sampling import SamplingParams
from specdec.v1 import common_pb2
from verifier_service.draft.client import DraftLink
from verifier_service.draft.stream import ProposeStream


class FinishedCall:
    """A Propose call the draft already ended: writes raise as grpc.aio does."""

    def __init__(self):
        self.cancelled = False

    async def write(self, request):
        raise asyncio.InvalidStateError("RPC already finished.")

    async def read(self):
        await asyncio.sleep(3600)  # the draft sends nothing

    async def done_writing(self):
        pass

    def cancel(self):
        self.cancelled = True


def test_a_finished_stream_is_an_empty_block_and_a_back_off():
    async def scenario():
        link = DraftLink("127.0.0.1:1", ServerConfig(), common_pb2.ModelInfo(vocab_size=10), timeout_s=1.0)
        session, call = link.session("r", SamplingParams()), FinishedCall()
        session.stream, session.synced = ProposeStream(call, session.ahead), 3
        block, reason = await session.propose([1, 2, 3, 1], 2)
        assert block.token_ids == [] and reason == "failed"
        assert call.cancelled and session.stream is None  # the next round opens a new stream
        assert not link.available()  # backed off; the round decodes without the draft
        await link.close()

    asyncio.run(scenario())


def test_a_stream_closed_during_its_round_is_not_a_draft_failure():
    async def scenario():
        link = DraftLink("127.0.0.1:1", ServerConfig(), common_pb2.ModelInfo(vocab_size=10), timeout_s=1.0)
        session = link.session("r", SamplingParams())

        class ClosingCall(FinishedCall):
            async def write(self, request):
                session.stream = None  # the sequence finished and closed its stream meanwhile
                raise asyncio.InvalidStateError("RPC already finished.")

        session.stream = ProposeStream(ClosingCall(), session.ahead)
        block, reason = await session.propose([1, 2, 3], 2)
        assert block.token_ids == [] and reason == "closed"
        assert link.available()  # no back-off for the other sequences
        await link.close()

    asyncio.run(scenario())


def test_a_blocks_chained_tokens_are_its_last_and_survive_slicing():
    """ProposeResponse.num_chained counts the block's last tokens (before any forced ones, num_forced); a prefetched
    or ahead block sliced from `offset` for k keeps those of them in the slice. A count past the block is an invalid
    block (the round goes without)."""
    import pytest

    from specdec.v1 import draft_pb2
    from verifier_service.draft.client import DraftUnavailable

    async def scenario():
        link = DraftLink("127.0.0.1:1", ServerConfig(), common_pb2.ModelInfo(vocab_size=100), timeout_s=0.2)
        session = link.session("r", SamplingParams())
        response = draft_pb2.ProposeResponse(token_ids=[1, 2, 3, 4, 5, 6], num_chained=4)  # [1, 2] matched
        assert session._block(response, 6).num_chained == 4
        assert session._block(response, 3, ahead=True).num_chained == 1  # [1, 2, 3]
        assert session._block(response, 1, ahead=True).num_chained == 0  # [1]
        sliced = session._block(response, 2, ahead=True, offset=3)  # [4, 5]
        assert sliced.token_ids == [4, 5] and sliced.num_chained == 2
        with pytest.raises(DraftUnavailable, match="7 chained and 0 forced of its 6 tokens"):
            session._block(draft_pb2.ProposeResponse(token_ids=[1, 2, 3, 4, 5, 6], num_chained=7), 6)
        # [1, 2] matched, [3, 4] chained, [5, 6] forced by the grammar: the forced ones are the last
        grammar = draft_pb2.ProposeResponse(token_ids=[1, 2, 3, 4, 5, 6], num_chained=2, num_forced=2)
        block = session._block(grammar, 5, ahead=True)  # [1, 2, 3, 4, 5]
        assert (block.num_chained, block.num_forced) == (2, 1)
        sliced = session._block(grammar, 2, ahead=True, offset=3)  # [4, 5]
        assert (sliced.num_chained, sliced.num_forced) == (1, 1)
        with pytest.raises(DraftUnavailable, match="2 chained and 5 forced"):
            session._block(draft_pb2.ProposeResponse(token_ids=[1, 2, 3, 4, 5, 6], num_chained=2, num_forced=5), 6)
        await link.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))
