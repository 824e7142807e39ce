"""Fairness: calls queued behind other prompts' prefill finish, and none is reaped while its client reads.

A real verifier process (tiny seeded target, no draft) with a TTL of half a second, a prefill of one token
per job and a prefill budget of one token, so each long prompt prefills alone in hundreds of jobs and the
last one waits seconds (many TTLs) for its first token while a short stream decodes between the chunks.
"""

from __future__ import annotations

import concurrent.futures
import time

import grpc
import pytest

from devkit.stack import Service, wait_serving
from specdec.v1 import verifier_pb2, verifier_pb2_grpc
from tests.reliability.support import SERVICE_ENV

pytestmark = pytest.mark.slow

TTL_S = 0.5
LONG_TOKENS = 400  # the tiny target's context is 512


def decode(address: str, request: verifier_pb2.DecodeRequest) -> tuple[str, float, float]:
    """(status, seconds to the first message, longest gap between messages)."""
    started = last = time.monotonic()
    first, gap = None, 0.0
    with grpc.insecure_channel(address) as channel:
        try:
            for _ in verifier_pb2_grpc.VerifierServiceStub(channel).Decode(request, timeout=120):
                now = time.monotonic()
                first = now - started if first is None else first
                gap, last = max(gap, now - last), now
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {exc.details()}", first or 0.0, gap
    return "OK", first or 0.0, gap


def test_calls_waiting_behind_long_prefills_complete_and_are_not_reaped(tiny_pair, tmp_path):
    verifier = Service("verifier_service", [
        "--model", str(tiny_pair[0]), "--threads", "1", "--grace-s", "1", "--sequence-ttl-s", str(TTL_S),
        "--prefill-chunk-tokens", "1", "--max-prefill-tokens", "1"], SERVICE_ENV, tmp_path)
    try:
        wait_serving(verifier.address, 120, verifier.process)
        longs = [verifier_pb2.DecodeRequest(request_id=f"long-{i}", max_tokens=4,
                                            prompt_token_ids=[3 + (i * 7 + j) % 250 for j in range(LONG_TOKENS)])
                 for i in range(4)]
        short = verifier_pb2.DecodeRequest(request_id="short", prompt_token_ids=[5, 6, 7], max_tokens=300)
        with concurrent.futures.ThreadPoolExecutor(5) as pool:
            short_result = pool.submit(decode, verifier.address, short)
            time.sleep(0.2)
            results = list(pool.map(lambda r: decode(verifier.address, r), longs))
            short_status, _, short_gap = short_result.result()
        print(f"figure: long prompts' first messages after {[round(r[1], 2) for r in results]} s "
              f"(TTL {TTL_S} s); the short stream's longest gap {short_gap:.3f} s")
        assert [status for status, _, _ in results] == ["OK"] * 4, verifier.log()[-2000:]
        assert short_status == "OK"
        assert max(first for _, first, _ in results) > 2 * TTL_S, "no call waited past the TTL: the test is vacuous"
        assert "dropping its sequence" not in verifier.log()
    finally:
        verifier.stop()
