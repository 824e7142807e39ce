"""Security: API keys at the gateway, secrets and prompts out of logs and spans, TLS and mTLS on every hop.

The TLS stack gets a throwaway CA and one service certificate (SAN 127.0.0.1 and
localhost), made here with `cryptography`; every service serves TLS and, since
--tls-ca is set, requires a client certificate from that CA (mTLS).
"""

from __future__ import annotations

import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specdec.v1 import draft_pb2, draft_pb2_grpc, gateway_pb2, gateway_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from tests.reliability.support import API_KEY, PROMPT_CANARY, Stack

pytestmark = pytest.mark.slow

REQUEST = gateway_pb2.GenerateRequest(prompt="The quick brown fox", max_tokens=4)


# ---------------------------------------------------------------- API keys


@pytest.mark.parametrize("metadata", [
    (), (("authorization", "Bearer wrong-key"),), (("authorization", f"Basic {API_KEY}"),),
    (("authorization", "Bearer "),), (("x-api-key", API_KEY[:-1]),),
], ids=["missing", "wrong", "not-bearer", "empty", "truncated"])
def test_missing_or_wrong_key_is_unauthenticated(main_stack, metadata):
    with grpc.insecure_channel(main_stack.gateway.address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        for call in (lambda: stub.Generate(REQUEST, timeout=30, metadata=metadata),
                     lambda: list(stub.GenerateStream(REQUEST, timeout=30, metadata=metadata))):
            with pytest.raises(grpc.RpcError) as raised:
                call()
            assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "authorization: Bearer" in raised.value.details()
            assert API_KEY not in raised.value.details()


def test_right_key_works_and_health_stays_open(main_stack):
    with grpc.insecure_channel(main_stack.gateway.address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        for metadata in [(("authorization", f"Bearer {API_KEY}"),), (("authorization", "bearer other-key"),),
                         (("x-api-key", API_KEY),)]:
            assert stub.Generate(REQUEST, timeout=60, metadata=metadata).usage.completion_tokens >= 1
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_keys_and_prompts_stay_out_of_logs_and_spans(main_stack, gateway_channel, otlp):
    stub = gateway_pb2_grpc.GatewayStub(gateway_channel)
    # a good request, a refused one, a cancelled one and an unauthenticated one, all carrying the canaries
    stub.Generate(gateway_pb2.GenerateRequest(prompt=PROMPT_CANARY, max_tokens=4), timeout=60)
    with pytest.raises(grpc.RpcError):
        stub.Generate(gateway_pb2.GenerateRequest(prompt=PROMPT_CANARY, temperature=-1), timeout=60)
    stream = stub.GenerateStream(gateway_pb2.GenerateRequest(prompt=PROMPT_CANARY, max_tokens=200), timeout=60)
    next(stream)
    stream.cancel()
    with grpc.insecure_channel(main_stack.gateway.address) as channel, pytest.raises(grpc.RpcError):
        gateway_pb2_grpc.GatewayStub(channel).Generate(
            REQUEST, timeout=30, metadata=(("authorization", f"Bearer {API_KEY}x"),))
    time.sleep(1.5)  # spans are exported every 200 ms
    logs = main_stack.logs()
    assert " DEBUG " in logs and "serving on port" in logs  # the gateway logs at DEBUG: the strictest case
    assert API_KEY not in logs and "other-key" not in logs
    assert PROMPT_CANARY not in logs
    spans = otlp.raw()
    assert b"specdec.request_id" in spans, "no spans were exported: the check would prove nothing"
    assert API_KEY.encode() not in spans and b"other-key" not in spans
    assert PROMPT_CANARY.encode() not in spans


# ---------------------------------------------------------------- TLS and mTLS


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    pytest.importorskip("cryptography")
    from tests.reliability.support import Certs

    return Certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls_stack(tiny_pair, certs, tmp_path_factory):
    target, draft = tiny_pair
    stack = Stack(target, draft, tmp_path_factory.mktemp("tls-logs"), method="ngram", tls=certs,
                  verifier_args=["--draft-timeout-ms", "2000"])
    yield stack
    stack.stop()


def test_tls_end_to_end(tls_stack, certs):
    """Client -> gateway -> verifier -> draft, every hop over TLS with client certificates."""
    with grpc.secure_channel(tls_stack.gateway.address, certs.client_credentials()) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        request = gateway_pb2.GenerateRequest(prompt="The quick brown fox jumps over the lazy dog. The quick brown",
                                              max_tokens=24, num_speculative_tokens=4)
        response = stub.Generate(request, timeout=60)
        assert response.usage.completion_tokens == len(response.token_ids) >= 1
        # the verifier reached the draft over mTLS: speculation happened
        assert response.speculation.num_draft_tokens > 0, response.speculation
        assert response.speculation.num_fallback_rounds == 0
    with grpc.secure_channel(f"localhost:{tls_stack.gateway.port}", certs.client_credentials()) as channel:
        assert gateway_pb2_grpc.GatewayStub(channel).Generate(REQUEST, timeout=60).usage.completion_tokens >= 1


def _refused(address: str, credentials=None) -> grpc.RpcError:
    channel = grpc.secure_channel(address, credentials) if credentials else grpc.insecure_channel(address)
    with channel, pytest.raises(grpc.RpcError) as raised:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return raised.value


@pytest.mark.parametrize("service", ["gateway", "verifier", "draft"])
def test_plaintext_and_untrusting_clients_are_refused(tls_stack, certs, service):
    address = tls_stack.services[service].address
    assert _refused(address).code() == grpc.StatusCode.UNAVAILABLE  # plaintext to a TLS port
    # a client that does not trust our CA (system roots only) refuses the server's certificate
    assert _refused(address, certs.client_credentials(ca=False)).code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("service", ["verifier", "draft"])
def test_internal_peers_need_a_client_certificate_from_our_ca(tls_stack, certs, service):
    address = tls_stack.services[service].address
    assert _refused(address, certs.client_credentials(client_cert="none")).code() == grpc.StatusCode.UNAVAILABLE
    assert _refused(address, certs.client_credentials(client_cert="rogue")).code() == grpc.StatusCode.UNAVAILABLE
    # with ours, the real RPCs work
    with grpc.secure_channel(address, certs.client_credentials()) as channel:
        if service == "verifier":
            info = verifier_pb2_grpc.VerifierServiceStub(channel).GetModelInfo(verifier_pb2.GetModelInfoRequest(),
                                                                               timeout=10)
        else:
            info = draft_pb2_grpc.DraftServiceStub(channel).GetDraftInfo(draft_pb2.GetDraftInfoRequest(), timeout=10)
        assert info.info.vocab_size > 0

