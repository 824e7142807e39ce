"""verifier_service/draft/client.py: back-off after draft failures, and which failures count."""

from __future__ import annotations

import asyncio

import grpc

from specdec.runtime import config as specdec_config
from specdec.v1 import common_pb2
from verifier_service.draft.client import Backoff, DraftLink


def test_backoff_doubles_to_a_ceiling_and_resets():
    backoff = Backoff(initial_s=0.25, maximum_s=1.0)
    assert backoff.ready()
    delays = []
    for _ in range(5):
        backoff.failed()
        delays.append(backoff.delay_s)
    assert delays == [0.25, 0.5, 1.0, 1.0, 1.0]
    assert not backoff.ready()
    backoff.succeeded()
    assert backoff.ready() and backoff.delay_s == 0


class FakeError(grpc.aio.AioRpcError):
    def __init__(self, code):
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=code.name)


def test_a_request_the_draft_refuses_does_not_back_off_everyone():
    async def scenario():
        link = DraftLink("127.0.0.1:1", specdec_config.ServerConfig(), common_pb2.ModelInfo(vocab_size=10), 0.1)
        link.checked = True
        link.failed(FakeError(grpc.StatusCode.INVALID_ARGUMENT))
        assert link.available() and link.checked
        link.failed(FakeError(grpc.StatusCode.UNAVAILABLE))
        assert not link.available()
        assert not link.checked, "after a failure, whatever answers next gets its tokenizer checked again"
        link.backoff.succeeded()
        link.failed(TimeoutError())
        assert not link.available()
        await link.close()
    asyncio.run(scenario())
