"""A verifier replaced while the gateway runs (issue 13, item 6): by one with another tokenizer, or by none.

The gateway re-checks the verifier at every reconnect (and every --peer-check-s): while it is unusable,
health is NOT_SERVING and requests get UNAVAILABLE naming the tokenizer, never an error about a field the
client did not send, and never text decoded with the wrong tokenizer. Every Decode also carries the
gateway's tokenizer fingerprint, which the verifier itself refuses on a mismatch.
"""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specdec.testing import build_other_tokenizer_model
from specdec.v1 import gateway_pb2, gateway_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from tests.reliability.support import Stack, wait_for

pytestmark = pytest.mark.slow

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture(scope="module")
def stack(tiny_pair, tmp_path_factory):
    target, draft = tiny_pair
    stack = Stack(target, draft, tmp_path_factory.mktemp("swap-logs"), method="ngram",
                  gateway_args=["--peer-check-s", "0.5"])
    yield stack
    stack.stop()


def _health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        try:
            return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status
        except grpc.RpcError:
            return -1


def _generate(address: str, request: gateway_pb2.GenerateRequest):
    with grpc.insecure_channel(address) as channel:
        return gateway_pb2_grpc.GatewayStub(channel).Generate(request, timeout=60)


def _refusal(address: str, request: gateway_pb2.GenerateRequest) -> str:
    """The details of the gateway's refusal of `request` ("" if it was served)."""
    try:
        _generate(address, request)
    except grpc.RpcError as exc:
        return exc.details() or ""
    return ""


TEXT = gateway_pb2.GenerateRequest(prompt="hello world", max_tokens=4)
IDS = gateway_pb2.GenerateRequest(prompt_token_ids=gateway_pb2.TokenIds(ids=[5, 6, 7]), max_tokens=4)


def test_a_verifier_with_another_tokenizer_takes_the_gateway_out_until_it_is_replaced(stack, tmp_path):
    assert _health(stack.gateway.address) == SERVING
    good = _generate(stack.gateway.address, IDS)

    stack.replace_verifier(build_other_tokenizer_model(tmp_path))
    assert wait_for(lambda: _health(stack.gateway.address) == NOT_SERVING, 15), stack.gateway.log()[-2000:]
    # NOT_SERVING comes first from the old verifier going away ("not answering"); the new one's tokenizer is
    # named from the watch's next check (at the reconnect, or within --peer-check-s)
    assert wait_for(lambda: "replaced" in _refusal(stack.gateway.address, IDS), 15), stack.gateway.log()[-2000:]
    for request in (TEXT, IDS):
        with pytest.raises(grpc.RpcError) as raised:
            _generate(stack.gateway.address, request)
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE, raised.value.details()
        assert "tokenizer" in raised.value.details() and "replaced" in raised.value.details()
    print(f"figure: requests while the verifier has another tokenizer: UNAVAILABLE: {raised.value.details()}")

    stack.replace_verifier()  # the right model again
    assert wait_for(lambda: _health(stack.gateway.address) == SERVING, 15), stack.gateway.log()[-2000:]
    assert list(_generate(stack.gateway.address, IDS).token_ids) == list(good.token_ids)


def test_the_verifier_refuses_ids_made_with_another_tokenizer(stack):
    """No window: even before the gateway's watch notices, the verifier checks the fingerprint per request."""
    with grpc.insecure_channel(stack.verifier.address) as channel:
        stub = verifier_pb2_grpc.VerifierServiceStub(channel)
        own = stub.GetModelInfo(verifier_pb2.GetModelInfoRequest(), timeout=10).info.tokenizer_fingerprint
        ok = verifier_pb2.DecodeRequest(prompt_token_ids=[5, 6, 7], max_tokens=2, tokenizer_fingerprint=own)
        assert list(stub.Decode(ok, timeout=60))[-1].usage.completion_tokens == 2
        with pytest.raises(grpc.RpcError) as raised:
            list(stub.Decode(verifier_pb2.DecodeRequest(prompt_token_ids=[5, 6, 7], max_tokens=2,
                                                        tokenizer_fingerprint="0" * 64), timeout=60))
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "another tokenizer" in raised.value.details()


def test_gateway_health_is_not_serving_while_the_verifier_is_down(stack):
    stack.verifier.stop()
    try:
        assert wait_for(lambda: _health(stack.gateway.address) == NOT_SERVING, 15), stack.gateway.log()[-2000:]
        with pytest.raises(grpc.RpcError) as raised:
            _generate(stack.gateway.address, TEXT)
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        stack.replace_verifier()
    assert wait_for(lambda: _health(stack.gateway.address) == SERVING, 15), stack.gateway.log()[-2000:]
    assert _generate(stack.gateway.address, TEXT).usage.completion_tokens >= 1
