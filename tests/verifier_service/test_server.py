"""verifier_service/server.py: the reaper ends calls whose client stopped reading, never calls waiting for compute.

An in-process Decode server over a stand-in engine (a round of prompt [1] waits a second, as behind other
sequences' prefill; prompt [2]'s rounds come at once), with a TTL far below that second.
"""

from __future__ import annotations

import asyncio
import time

import grpc

from specdec.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
from verifier_service.config import VerifierConfig
from verifier_service.server import VerifierServicer

TTL_S = 0.3
SLOW_ROUND_S = 1.0


class WaitingEngine:
    """Prompt [1]: each round waits SLOW_ROUND_S for compute; any other prompt: rounds at once."""

    name = "waiting"
    vocab_size = 100
    max_context = 100_000
    takes_draft_probs = True

    async def rounds(self, spec, speculation):
        while True:
            await asyncio.sleep(SLOW_ROUND_S if spec.prompt_ids == [1] else 0)
            yield [7]


async def serve():
    server = grpc.aio.server()
    servicer = VerifierServicer(WaitingEngine(), None, common_pb2.ModelInfo(), VerifierConfig(sequence_ttl_s=TTL_S),
                                None)
    verifier_pb2_grpc.add_VerifierServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, servicer, f"127.0.0.1:{port}"


def read_all(address: str, request: verifier_pb2.DecodeRequest) -> list[int]:
    with grpc.insecure_channel(address) as channel:
        return [t for m in verifier_pb2_grpc.VerifierServiceStub(channel).Decode(request, timeout=30)
                for t in m.token_ids]


def stop_reading(address: str, request: verifier_pb2.DecodeRequest, pause_s: float) -> grpc.RpcError:
    """Read one message, stop reading for pause_s (a window of one byte fills at once), then read on."""
    options = [("grpc.http2.lookahead_bytes", 1), ("grpc.http2.bdp_probe", 0)]
    with grpc.insecure_channel(address, options=options) as channel:
        call = verifier_pb2_grpc.VerifierServiceStub(channel).Decode(request, timeout=30)
        next(call)
        time.sleep(pause_s)
        try:
            for _ in call:
                pass
        except grpc.RpcError as exc:
            return exc
    raise AssertionError("the call ended without a status")


def test_a_sequence_waiting_for_compute_is_not_reaped_and_one_not_read_is():
    async def scenario():
        server, servicer, address = await serve()
        try:
            waiting = verifier_pb2.DecodeRequest(request_id="waits", prompt_token_ids=[1], max_tokens=3)
            started = time.monotonic()
            tokens = await asyncio.to_thread(read_all, address, waiting)
            assert tokens == [7, 7, 7]  # 3 s of waiting, ten TTLs, read throughout: never reaped
            assert time.monotonic() - started >= 3 * SLOW_ROUND_S

            unread = verifier_pb2.DecodeRequest(request_id="unread", prompt_token_ids=[2], max_tokens=50_000)
            error = await asyncio.to_thread(stop_reading, address, unread, TTL_S * 8)
            assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "--sequence-ttl-s" in error.details()
            assert not servicer.sequences.live
        finally:
            await server.stop(0)

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_an_engine_without_constraints_refuses_one_with_failed_precondition():
    """WaitingEngine has no takes_constraints: a constraint is refused before work."""

    async def scenario():
        server, _servicer, address = await serve()
        try:
            request = verifier_pb2.DecodeRequest(prompt_token_ids=[2], max_tokens=2,
                                                 constraint=common_pb2.Constraint(regex="[0-9]+"))
            return await asyncio.to_thread(read_error, address, request)
        finally:
            await server.stop(None)

    error = asyncio.run(scenario())
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and "structured outputs" in error.details()


def read_error(address: str, request: verifier_pb2.DecodeRequest) -> grpc.RpcError:
    try:
        read_all(address, request)
    except grpc.RpcError as exc:
        return exc
    raise AssertionError("the call succeeded")
