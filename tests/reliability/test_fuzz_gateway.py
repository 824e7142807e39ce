"""Property: no GenerateRequest makes the running gateway answer UNKNOWN/INTERNAL, or hang.

Hypothesis builds random requests (any field may be out of range) and sends each one
with a deadline. Every answer is either a complete response or one of the statuses a
client can act on. A good request still works afterwards.
"""

from __future__ import annotations

import math

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

pytestmark = pytest.mark.slow

ALLOWED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.FAILED_PRECONDITION}
DEADLINE_S = 30

floats = st.one_of(st.floats(width=32, allow_nan=True, allow_infinity=True),
                   st.sampled_from([0.0, 1.0, 1e-6, 1e-5, 0.7, -0.0, 2.0]))
texts = st.text(st.characters(codec="utf-8"), max_size=40)
token_ids = st.lists(st.integers(min_value=-(2**31), max_value=2**31 - 1) | st.integers(0, 400), max_size=12)


@st.composite
def generate_requests(draw) -> gateway_pb2.GenerateRequest:
    request = gateway_pb2.GenerateRequest()
    which = draw(st.sampled_from(["prompt", "ids", "none"]))
    if which == "prompt":
        request.prompt = draw(texts)
    elif which == "ids":
        request.prompt_token_ids.ids.extend(draw(token_ids))
    # small max_tokens keep each example short; sometimes huge, to hit the context check
    request.max_tokens = draw(st.integers(0, 6) | st.sampled_from([600, 2**32 - 1]))
    if request.max_tokens == 0:
        request.max_tokens = draw(st.sampled_from([0, 1]))  # 0 asks for the default (256): keep it rare
    request.temperature = draw(floats)
    if draw(st.booleans()):
        request.top_p = draw(floats)
    request.top_k = draw(st.integers(-(2**31), 2**31 - 1) | st.integers(-2, 50))
    if draw(st.booleans()):
        request.seed = draw(st.integers(0, 2**64 - 1))
    request.stop.extend(draw(st.lists(texts, max_size=18)))
    if draw(st.booleans()):
        request.num_speculative_tokens = draw(st.integers(0, 2**32 - 1) | st.integers(0, 17))
    return request


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(request=generate_requests())
def test_random_requests_get_a_response_or_an_actionable_status(gateway_channel, request):
    stub = gateway_pb2_grpc.GatewayStub(gateway_channel)
    if request.max_tokens == 0 and request.WhichOneof("input"):
        request.max_tokens = 1  # the 256-token default is valid, just slow for a property test
    try:
        response = stub.Generate(request, timeout=DEADLINE_S)
    except grpc.RpcError as exc:
        assert exc.code() in ALLOWED, f"{exc.code().name}: {exc.details()} for {request}"
        assert exc.details(), "a refusal says why"
        return
    assert response.finish_reason in (common_pb2.FINISH_REASON_STOP, common_pb2.FINISH_REASON_LENGTH)
    assert response.usage.completion_tokens == len(response.token_ids) <= request.max_tokens
    assert math.isfinite(request.temperature) and request.temperature >= 0


def test_a_good_request_works_after_the_fuzzing(gateway_channel):
    stub = gateway_pb2_grpc.GatewayStub(gateway_channel)
    response = stub.Generate(gateway_pb2.GenerateRequest(prompt="The quick brown fox", max_tokens=8), timeout=60)
    assert response.usage.completion_tokens == len(response.token_ids) >= 1
    pieces = list(stub.GenerateStream(gateway_pb2.GenerateRequest(prompt="The quick brown fox", max_tokens=8),
                                      timeout=60))
    assert [t for p in pieces for t in p.token_ids] == list(response.token_ids)
