"""A verifier replaced while the gateway runs (issue 13, item 6; issue 32, items 5 and 7): by one with another
tokenizer, by another model with the same tokenizer, or by none; and one that hangs.

The gateway re-checks the verifier at every reconnect (and every --peer-check-s): while it is unusable,
health is NOT_SERVING and requests get UNAVAILABLE naming the tokenizer or the models, never an error about a
field the client did not send, and never text decoded with the wrong tokenizer or served under another
model's name. Every Decode also carries the gateway's tokenizer fingerprint, which the verifier itself refuses
on a mismatch. gRPC health and HTTP /health report one verdict, also while the verifier hangs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
import urllib.error
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devkit.testing import build_other_tokenizer_model
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


def _http(stack, path: str) -> tuple[int, dict]:
    """(status, JSON body) of a GET on the gateway's HTTP API; (-1, {}) when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{stack.gateway.http_port}{path}", timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except OSError:
        return -1, {}


def _http_serving(stack) -> bool:
    return _http(stack, "/health")[0] == 200


def _served_names(stack) -> list[str]:
    return [model["id"] for model in _http(stack, "/v1/models")[1]["data"]]


def _fingerprint(address: str) -> str:
    with grpc.insecure_channel(address) as channel:
        stub = verifier_pb2_grpc.VerifierServiceStub(channel)
        return stub.GetModelInfo(verifier_pb2.GetModelInfoRequest(), timeout=10).info.model_fingerprint


def test_another_model_with_the_same_tokenizer_takes_the_gateway_out_on_both_front_doors(stack, tiny_pair):
    target, other_weights = tiny_pair  # the draft model: the target's tokenizer, other weights
    pinned = _fingerprint(stack.verifier.address)
    assert _health(stack.gateway.address) == SERVING and _http_serving(stack)

    stack.replace_verifier(other_weights)
    swapped = _fingerprint(stack.verifier.address)
    assert swapped and swapped != pinned
    assert wait_for(lambda: "another model" in _http(stack, "/health")[1].get("error", {}).get("message", ""), 15), \
        stack.gateway.log()[-2000:]
    status, body = _http(stack, "/health")
    reason = body["error"]["message"]
    assert status == 503 and all(part in reason for part in (str(target), pinned, str(other_weights), swapped))
    assert _health(stack.gateway.address) == NOT_SERVING
    with pytest.raises(grpc.RpcError) as raised:
        _generate(stack.gateway.address, IDS)
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE and "another model" in raised.value.details()
    print(f"figure: gateway health with a swapped verifier (same tokenizer): gRPC NOT_SERVING; HTTP /health "
          f"{status}: {reason}")

    stack.replace_verifier()  # the pinned model again
    assert wait_for(lambda: _health(stack.gateway.address) == SERVING and _http_serving(stack), 15), \
        stack.gateway.log()[-2000:]


def test_the_served_model_name_follows_the_verifier(stack, tiny_pair, tmp_path):
    target, _ = tiny_pair
    assert _served_names(stack) == [str(target)]
    renamed = shutil.copytree(target, tmp_path / "renamed-target")  # the same model under another name
    try:
        stack.replace_verifier(renamed)
        assert wait_for(lambda: _served_names(stack) == [str(renamed)], 15), stack.gateway.log()[-2000:]
        assert _health(stack.gateway.address) == SERVING and _http_serving(stack)
    finally:
        stack.replace_verifier()
    assert wait_for(lambda: _served_names(stack) == [str(target)], 15), stack.gateway.log()[-2000:]


def test_grpc_health_and_http_health_agree_while_the_verifier_hangs(stack):
    """SIGSTOP the verifier: both front doors go NOT_SERVING together (within --peer-check-s plus the watch's
    timeout), and never disagree on a sample the gRPC side gave twice, before and after the HTTP one."""
    assert wait_for(lambda: _health(stack.gateway.address) == SERVING and _http_serving(stack), 15)
    pid = stack.verifier.process.pid
    disagreements, samples = [], 0
    os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 12
        while time.monotonic() < deadline:
            before = _health(stack.gateway.address) == SERVING
            http = _http_serving(stack)
            after = _health(stack.gateway.address) == SERVING
            samples += 1
            if before == after and http != before:
                disagreements.append((round(12 - (deadline - time.monotonic()), 1), before, http))
            if not (before or after or http) and samples > 1:
                break
        both_out = _health(stack.gateway.address) == NOT_SERVING and not _http_serving(stack)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert not disagreements, f"gRPC health and HTTP /health disagreed at (s, gRPC serving, HTTP serving): " \
                              f"{disagreements}"
    assert both_out, stack.gateway.log()[-2000:]
    assert wait_for(lambda: _health(stack.gateway.address) == SERVING and _http_serving(stack), 20), \
        stack.gateway.log()[-2000:]
    print(f"figure: {samples} samples while the verifier was stopped, 0 disagreements")
