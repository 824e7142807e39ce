"""A draft stream that ends under the verifier turns into DraftUnavailable, never an error for the client."""

import asyncio

import pytest

from specdec.config import ServerConfig
from specdec.v1 import common_pb2
from verifier_service.draft_client import DraftLink, DraftSession, DraftUnavailable


class FinishedCall:
    """A Propose call the draft already ended: writes raise as grpc.aio does."""

    def __init__(self):
        self.cancelled = False

    async def write(self, request):
        raise asyncio.InvalidStateError("RPC already finished.")

    async def read(self):
        raise AssertionError("never reached")

    def cancel(self):
        self.cancelled = True


def test_a_finished_stream_is_draft_unavailable():
    async def scenario():
        link = DraftLink("127.0.0.1:1", ServerConfig(), common_pb2.ModelInfo(vocab_size=10), timeout_s=1.0)
        call = FinishedCall()
        with pytest.raises(DraftUnavailable):
            await DraftSession(link, call, 3).propose(3, [1], 2)
        assert call.cancelled and not link.available()  # backed off; the round decodes without the draft
        await link.close()

    asyncio.run(scenario())
