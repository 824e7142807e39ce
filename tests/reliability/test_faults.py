"""Faults: the draft dies, comes back, or is slow; the verifier dies; caps and the idle TTL hold.

One stack (n-gram draft, whose process restarts quickly) with a small draft delay so
that requests last long enough to be interrupted, a verifier with tight caps and a
short idle TTL. The tests run in file order: the last one kills the verifier.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time

import grpc
import pytest

from specdec.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from tests.reliability.support import LONG_PROMPT, Stack, counter, gauge, wait_for

pytestmark = pytest.mark.slow

DELAY_MS = 15  # per draft block: a 240-token request lasts a few seconds
DRAFT_TIMEOUT_MS = 400
TTL_S = 2.0
MAX_SEQUENCES = 3
MAX_CACHE_TOKENS = 900
LONG = gateway_pb2.GenerateRequest(prompt=LONG_PROMPT, max_tokens=240, num_speculative_tokens=4)


@pytest.fixture(scope="module")
def stack(tiny_pair, tmp_path_factory):
    target, draft = tiny_pair
    stack = Stack(target, draft, tmp_path_factory.mktemp("fault-logs"), method="ngram",
                  draft_args=["--enable-fault-injection", "true", "--inject-delay-ms", str(DELAY_MS)],
                  verifier_args=["--draft-timeout-ms", str(DRAFT_TIMEOUT_MS), "--sequence-ttl-s", str(TTL_S),
                                 "--max-sequences", str(MAX_SEQUENCES), "--max-cache-tokens", str(MAX_CACHE_TOKENS)])
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
def gateway(stack):
    channel = grpc.insecure_channel(stack.gateway.address)
    yield gateway_pb2_grpc.GatewayStub(channel)
    channel.close()


@pytest.fixture(scope="module")
def reference(gateway):
    """The fault-free greedy output of LONG, and target-only decoding's (k = 0) for comparison."""
    response = gateway.Generate(LONG, timeout=120)
    plain = gateway.Generate(gateway_pb2.GenerateRequest(prompt=LONG_PROMPT, max_tokens=240,
                                                         num_speculative_tokens=0), timeout=120)
    assert list(response.token_ids) == list(plain.token_ids)
    assert response.usage.completion_tokens == 240, "LONG_PROMPT should not hit EOS on the tiny target"
    assert response.speculation.num_draft_tokens > 0
    return list(response.token_ids)


def stream_tokens(gateway, request, on_first=None, timeout=120):
    tokens, last = [], None
    for i, piece in enumerate(gateway.GenerateStream(request, timeout=timeout)):
        tokens += piece.token_ids
        last = piece
        if i == 2 and on_first is not None:
            on_first()
    return tokens, last


def test_caps_answer_resource_exhausted(stack, gateway):
    """--max-sequences and --max-cache-tokens refuse new work with RESOURCE_EXHAUSTED (and the process lives)."""
    assert wait_for(lambda: gauge(stack.verifier) == 0, 10)
    # two sequences reserve 2 x (prompt + 400) tokens of the 900 allowed: a third of that size does not fit
    big = gateway_pb2.GenerateRequest(prompt=LONG_PROMPT, max_tokens=400)
    small = gateway_pb2.GenerateRequest(prompt=LONG_PROMPT, max_tokens=20)
    streams = [gateway.GenerateStream(big, timeout=120) for _ in range(2)]
    try:
        for s in streams:
            next(s)  # both admitted
        with pytest.raises(grpc.RpcError) as raised:
            gateway.Generate(big, timeout=30)
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-cache-tokens" in raised.value.details()
        streams.append(gateway.GenerateStream(small, timeout=120))
        next(streams[-1])  # a small one still fits: 3 sequences, the cap
        with pytest.raises(grpc.RpcError) as raised:
            gateway.Generate(small, timeout=30)
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-sequences" in raised.value.details()
    finally:
        for s in streams:
            s.cancel()
    assert wait_for(lambda: gauge(stack.verifier) == 0, 10)
    assert gateway.Generate(small, timeout=60).usage.completion_tokens == 20


def test_idle_sequence_is_dropped_after_the_ttl(stack):
    """A client that stops reading: its window fills, the sequence stops making progress, the reaper drops it.

    The client's HTTP/2 window is made tiny so that "stops reading" shows within a few messages.
    """
    options = [("grpc.http2.lookahead_bytes", 1), ("grpc.http2.bdp_probe", 0)]
    with grpc.insecure_channel(stack.verifier.address, options=options) as channel:
        stub = verifier_pb2_grpc.VerifierServiceStub(channel)
        call = stub.Decode(verifier_pb2.DecodeRequest(request_id="idle-client", prompt_token_ids=[5, 6, 7],
                                                      max_tokens=400, num_speculative_tokens=4), timeout=60)
        # both copies of the sequence are live before the client stops reading. The draft's copy opens with the
        # verifier's first ask, and on a loaded machine that ask may time out and back off: the client reads on,
        # one message at a time, until the draft's copy is live too. Each side is watched on its own, not both
        # in one scrape
        seen = set()

        def both_seen() -> bool:
            seen.update(name for name, service in (("verifier", stack.verifier), ("draft", stack.draft))
                        if gauge(service) == 1)
            return len(seen) == 2

        deadline = time.monotonic() + 10
        next(call)
        while not both_seen():
            assert time.monotonic() < deadline, f"live on {sorted(seen)} only"
            assert next(call, None) is not None, f"the request ended while live on {sorted(seen)} only"
        started = time.monotonic()  # the client reads no more from here
        # within the TTL (plus the reaper's period) both copies of the sequence are gone
        assert wait_for(lambda: gauge(stack.verifier) == 0 and gauge(stack.draft) == 0, TTL_S * 4)
        dropped_after = time.monotonic() - started
        assert dropped_after >= TTL_S * 0.5
        # reading again, the client learns why at once instead of waiting for its own deadline
        resumed = time.monotonic()
        with pytest.raises(grpc.RpcError) as raised:
            for _ in call:
                pass
        assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "--sequence-ttl-s" in raised.value.details()
        assert time.monotonic() - resumed < 5
        print(f"figure: idle sequence dropped {dropped_after:.1f} s after the client stopped reading "
              f"(TTL {TTL_S} s); status reached the client {time.monotonic() - resumed:.3f} s after it read again")


def test_draft_killed_mid_stream_request_completes_identically(stack, gateway, reference):
    killed = []

    def kill_draft():
        stack.draft.kill()
        killed.append(time.monotonic())

    tokens, last = stream_tokens(gateway, LONG, on_first=kill_draft)
    assert killed, "the stream ended before the draft could be killed"
    assert tokens == reference
    assert last.finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert last.speculation.num_fallback_rounds > 0
    print(f"figure: draft killed mid-stream: {len(tokens)} tokens identical to the fault-free run, "
          f"{last.speculation.num_fallback_rounds} of {last.speculation.num_rounds} rounds fell back")
    # with the draft gone, new requests still work (plain decoding)
    after = gateway.Generate(LONG, timeout=120)
    assert list(after.token_ids) == reference
    assert after.speculation.num_draft_tokens == 0 or after.speculation.num_fallback_rounds > 0
    assert counter(stack.verifier, "specdec_fallback_rounds") > 0


def test_speculation_resumes_after_the_draft_restarts_on_the_same_port(stack, gateway, reference):
    stack.restart_draft()

    def speculating():
        response = gateway.Generate(gateway_pb2.GenerateRequest(prompt=LONG_PROMPT, max_tokens=40,
                                                                num_speculative_tokens=4), timeout=60)
        return response.speculation.num_draft_tokens > 0

    # the shared back-off is 5 s at most, and the channel retries the connection every 2 s at most
    restarted = time.monotonic()
    assert wait_for(speculating, 30, interval_s=0.5), stack.verifier.log()[-3000:]
    print(f"figure: speculation resumed {time.monotonic() - restarted:.1f} s after the draft served again")
    response = gateway.Generate(LONG, timeout=120)
    assert list(response.token_ids) == reference and response.speculation.num_draft_tokens > 0


def test_slow_draft_falls_back_and_stays_lossless(stack, gateway, reference):
    stack.restart_draft(["--enable-fault-injection", "true", "--inject-delay-ms", str(DRAFT_TIMEOUT_MS * 3)])
    request = gateway_pb2.GenerateRequest(prompt=LONG_PROMPT, max_tokens=60, num_speculative_tokens=4)
    started = time.perf_counter()
    response = gateway.Generate(request, timeout=120)
    elapsed = time.perf_counter() - started
    assert list(response.token_ids) == reference[:60]
    assert response.speculation.num_fallback_rounds > 0
    # the back-off keeps most rounds from waiting for the slow draft
    assert elapsed < 60 * DRAFT_TIMEOUT_MS / 1000 / 2, elapsed
    print(f"figure: slow draft ({DRAFT_TIMEOUT_MS * 3} ms > {DRAFT_TIMEOUT_MS} ms timeout): 60 tokens identical, "
          f"{response.speculation.num_fallback_rounds}/{response.speculation.num_rounds} rounds fell back, "
          f"{elapsed:.2f} s")


def test_verifier_killed_clients_get_unavailable_quickly(stack, gateway):
    """In-flight streams and new requests fail with UNAVAILABLE within seconds; nothing hangs."""
    errors, ended = [], []

    def client():
        try:
            stream_tokens(gateway, LONG, timeout=60)
        except grpc.RpcError as exc:
            errors.append(exc)
        ended.append(time.monotonic())

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(client) for _ in range(2)]
        assert wait_for(lambda: gauge(stack.verifier) == 2, 30)
        threading.Event().wait(0.3)
        stack.verifier.kill()
        killed = time.monotonic()
        concurrent.futures.wait(futures, timeout=30)
    assert len(ended) == 2 and max(ended) - killed < 5, [e - killed for e in ended]
    assert [e.code() for e in errors] == [grpc.StatusCode.UNAVAILABLE] * 2, [e.details() for e in errors]
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as raised:
        gateway.Generate(LONG, timeout=60)
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "verifier" in raised.value.details()
    assert time.monotonic() - started < 5
    print(f"figure: verifier killed: in-flight streams got UNAVAILABLE after "
          f"{max(ended) - killed:.2f} s, a new request after {time.monotonic() - started:.3f} s")
    # the gateway itself is still up and says so
    assert stack.gateway.process.poll() is None
