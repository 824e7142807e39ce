"""verifier_service/draft/client.py: back-off after draft failures, and which failures count."""

from __future__ import annotations

import asyncio

import grpc

from specdec.runtime import config as specdec_config
from specdec.v1 import common_pb2
from verifier_service.draft.client import PATIENCE, WAITS_SKIPPED, Backoff, DraftLink


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


def test_a_draft_that_keeps_timing_out_is_not_asked_for_a_while_that_grows_with_the_waits():
    """The first PATIENCE - 1 timeouts back off as any failure (a slow draft's pace is still being learnt); from
    the PATIENCE-th in a row, the back-off is 2, 4, 8, ... times the wait just lost, up to WAITS_SKIPPED times it,
    past the 5 s ceiling of other failures; an answer resets it."""
    backoff = Backoff(initial_s=0.25, maximum_s=5.0)
    delays = []
    for _ in range(PATIENCE + 6):
        backoff.failed(waited_s=2.0)
        delays.append(backoff.delay_s)
    assert delays[:PATIENCE - 1] == [0.25, 0.5]
    assert delays[PATIENCE - 1:] == [4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 128.0]
    assert max(delays) == 2.0 * WAITS_SKIPPED
    backoff.succeeded()
    backoff.failed(waited_s=2.0)
    assert backoff.delay_s == 0.25, "an answer resets the count of timeouts in a row"


def test_a_timed_out_round_reports_timeout_and_backs_off_with_its_wait():
    async def scenario():
        link = DraftLink("127.0.0.1:1", specdec_config.ServerConfig(), common_pb2.ModelInfo(vocab_size=10), 0.1)
        for _ in range(PATIENCE):
            link.failed(asyncio.TimeoutError(), waited_s=1.0)
        assert link.backoff.delay_s == 2.0
        await link.close()
    asyncio.run(scenario())
