"""Hardening, through the real processes: the shipped secure configuration (internal token on every hop, API
keys at the gateway) refuses callers without credentials at the internal ports while the gateway path works;
undecodable messages, forged log lines, cancellations and mismatched limits leave no ERROR in any log; a seed
with a fixed k reproduces under concurrency; and the processes run as the benchmark measures them.

One stack: n-gram draft that serves blocks of at most 8 tokens, a verifier that allows k up to 32.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import re
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specdec.runtime.interceptors import INTERNAL_TOKEN_KEY
from specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc, gateway_pb2, gateway_pb2_grpc, verifier_pb2, \
    verifier_pb2_grpc
from tests.reliability.support import API_KEY, Service, Stack, authed_channel, wait_exit, wait_for
from tests.reliability.test_bad_input import _raw_call
from tests.reliability.test_cancellation import cancel_many
from tests.specdec.runtime.test_call_guards import listening_address

pytestmark = pytest.mark.slow

TOKEN = "internal-7c1d9e0b4a2f8c6e5d3b1a09"  # a canary too: it must not show up in a log
DRAFT_MAX_K, VERIFIER_MAX_K = 8, 32
COPY_PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick"
ERROR_LINE = re.compile(r" (ERROR|CRITICAL) |Traceback|Task was destroyed|never retrieved")


@pytest.fixture(scope="module")
def token_file(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("secrets") / "internal-token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def stack(tiny_pair, tmp_path_factory, token_file):
    target, draft = tiny_pair
    secure = ["--internal-token-file", str(token_file)]
    stack = Stack(target, draft, tmp_path_factory.mktemp("hardening-logs"), method="ngram",
                  draft_args=[*secure, "--max-speculative-tokens", str(DRAFT_MAX_K)],
                  verifier_args=[*secure, "--max-speculative-tokens", str(VERIFIER_MAX_K),
                                 "--draft-timeout-ms", "5000"],
                  gateway_args=[*secure, "--api-keys", API_KEY])
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
def gateway(stack):
    channel = authed_channel(stack.gateway.address)
    yield gateway_pb2_grpc.GatewayStub(channel)
    channel.close()


def error_lines(stack) -> list[str]:
    return [line for line in stack.logs().splitlines() if ERROR_LINE.search(line)]


TOKEN_METADATA = ((INTERNAL_TOKEN_KEY, TOKEN),)
DECODE = verifier_pb2.DecodeRequest(prompt_token_ids=[5, 6, 7], max_tokens=3)
START = draft_pb2.ProposeRequest(start=draft_pb2.StartSequence(request_id="r", prompt_token_ids=[5, 6, 7]))


def test_internal_ports_refuse_callers_without_the_token_while_the_gateway_path_works(stack, gateway):
    with grpc.insecure_channel(stack.verifier.address) as channel:
        stub = verifier_pb2_grpc.VerifierServiceStub(channel)
        calls = {"verifier Decode": lambda md: list(stub.Decode(DECODE, timeout=30, metadata=md)),
                 "verifier GetModelInfo": lambda md: stub.GetModelInfo(verifier_pb2.GetModelInfoRequest(),
                                                                       timeout=30, metadata=md)}
        _refused_without_the_token(calls)
        assert _health(channel) == health_pb2.HealthCheckResponse.SERVING  # probes stay open
        # with the token, the same call works (what the gateway does)
        assert list(stub.Decode(DECODE, timeout=60, metadata=TOKEN_METADATA))[-1].usage.completion_tokens == 3
    with grpc.insecure_channel(stack.draft.address) as channel:
        stub = draft_pb2_grpc.DraftServiceStub(channel)
        calls = {"draft Propose": lambda md: list(stub.Propose(iter([START]), timeout=30, metadata=md)),
                 "draft GetDraftInfo": lambda md: stub.GetDraftInfo(draft_pb2.GetDraftInfoRequest(), timeout=30,
                                                                    metadata=md)}
        _refused_without_the_token(calls)
        assert _health(channel) == health_pb2.HealthCheckResponse.SERVING
    # the public path: API key at the gateway, the token on gateway -> verifier -> draft
    response = gateway.Generate(gateway_pb2.GenerateRequest(prompt=COPY_PROMPT, max_tokens=24,
                                                            num_speculative_tokens=4), timeout=60)
    assert response.usage.completion_tokens == len(response.token_ids) >= 1
    assert response.speculation.num_draft_tokens > 0 and response.speculation.num_fallback_rounds == 0, \
        response.speculation
    assert TOKEN not in stack.logs()


def _refused_without_the_token(calls: dict) -> None:
    for name, call in calls.items():
        for metadata in [(), ((INTERNAL_TOKEN_KEY, TOKEN[:-1]),), (("authorization", f"Bearer {API_KEY}"),)]:
            with pytest.raises(grpc.RpcError) as raised:
                call(metadata)
            assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED, (name, raised.value.details())
            assert "--internal-token-file" in raised.value.details(), (name, raised.value.details())
        print(f"figure: {name} without the internal token: UNAUTHENTICATED: {raised.value.details()}")


def _health(channel) -> int:
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status


def field_1(payload: bytes) -> bytes:
    return b"\x0a" + bytes([len(payload)]) + payload


def test_undecodable_messages_are_invalid_argument_on_all_three(stack):
    """Invalid UTF-8 in a string field: INVALID_ARGUMENT with the parser's reason, no traceback in any log."""
    bad = field_1(b"\xff\xfe")
    cases = [(stack.gateway, "unary", "/specdec.v1.Gateway/Generate", bad, (("authorization", f"Bearer {API_KEY}"),)),
             (stack.verifier, "stream", "/specdec.v1.VerifierService/Decode", bad, TOKEN_METADATA),
             (stack.draft, "bidi", "/specdec.v1.DraftService/Propose", field_1(bad), TOKEN_METADATA)]
    for service, kind, method, payload, metadata in cases:
        with grpc.insecure_channel(service.address) as channel:
            with pytest.raises(grpc.RpcError) as raised:
                _raw_call(channel, kind, method, payload, metadata)
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, raised.value.details())
            assert "bad UTF-8" in raised.value.details()
            print(f"figure: {method}: {raised.value.code().name}: {raised.value.details()}")
    time.sleep(0.5)
    assert error_lines(stack) == []


FORGED = "2099-01-01 00:00:00,000 CRITICAL verifier_service: forged"


@pytest.mark.parametrize("field", ["request_id", "tenant"])
def test_client_strings_cannot_forge_log_lines(stack, field):
    request = verifier_pb2.DecodeRequest(prompt_token_ids=[5, 6], max_tokens=2)
    setattr(request, field, f"abc\n{FORGED}")
    with grpc.insecure_channel(stack.verifier.address) as channel:
        with pytest.raises(grpc.RpcError) as raised:
            list(verifier_pb2_grpc.VerifierServiceStub(channel).Decode(request, timeout=30, metadata=TOKEN_METADATA))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in raised.value.details() and "control characters" in raised.value.details()
    assert not any(line.startswith(FORGED) for line in stack.logs().splitlines())


def test_cancellations_and_refusals_log_no_errors(stack):
    """A cancelled request is not an error: 96 cancellations (and deadlines) mid-stream, no ERROR in any log."""
    outcomes = asyncio.run(cancel_many(stack.gateway.address, 96, 16))
    assert not outcomes["other"], outcomes["other"][:5]
    assert outcomes["cancelled"] >= 48, outcomes
    time.sleep(1.0)
    lines = error_lines(stack)
    assert lines == [], "\n".join(lines[:20])
    print(f"figure: {outcomes}; ERROR/Traceback lines in the three logs: {len(lines)}")


def test_k_is_capped_at_the_drafts_maximum_and_said_once(stack, gateway):
    """Verifier max k 32, draft max 8: a k=20 request drafts blocks of up to 8, with no fallback round."""
    response = gateway.Generate(gateway_pb2.GenerateRequest(prompt=COPY_PROMPT, max_tokens=40,
                                                            num_speculative_tokens=20), timeout=60)
    stats = response.speculation
    assert stats.num_fallback_rounds == 0 and stats.num_drafts > 0, stats
    assert len(stats.accepted_per_position) <= DRAFT_MAX_K, stats
    log = stack.verifier.log()
    assert log.count(f"serves blocks of at most {DRAFT_MAX_K} tokens (its --max-speculative-tokens)") == 1, log[-2000:]
    assert "decoding without the draft" not in log


def test_a_seed_with_a_fixed_k_reproduces_under_concurrency(stack, gateway):
    """The promise SamplingParams.seed makes: same seed and same explicit k give the same output, whatever
    else runs (here: adaptive-k requests that move the server-wide state the adaptive policy reads)."""
    seeded = gateway_pb2.GenerateRequest(prompt=COPY_PROMPT, max_tokens=32, temperature=1.0, seed=1234,
                                         num_speculative_tokens=3)
    noise = gateway_pb2.GenerateRequest(prompt=COPY_PROMPT, max_tokens=32, temperature=1.0)

    async def run() -> list:
        async with grpc.aio.insecure_channel(stack.gateway.address) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            metadata = (("authorization", f"Bearer {API_KEY}"),)
            calls = [stub.Generate(r, timeout=120, metadata=metadata) for r in [seeded, noise] * 4]
            return await asyncio.gather(*calls)

    responses = asyncio.run(run())[0::2]
    outputs = {tuple(r.token_ids) for r in responses}
    assert all(r.speculation.num_fallback_rounds == 0 and r.speculation.num_drafts > 0 for r in responses)
    assert len(outputs) == 1, outputs
    # and k = 0 (no speculation) with the same seed is reproducible too
    plain = gateway_pb2.GenerateRequest(prompt=COPY_PROMPT, max_tokens=16, temperature=1.0, seed=7,
                                        num_speculative_tokens=0)
    assert len({tuple(gateway.Generate(plain, timeout=60).token_ids) for _ in range(2)}) == 1


def test_metrics_listen_only_on_the_services_host(stack):
    """Service starts every process with --host 127.0.0.1: /metrics binds there too, not on 0.0.0.0."""
    for name, service in stack.services.items():
        assert listening_address(service.metrics_port) == "127.0.0.1", name


def environment(pid: int) -> dict[str, str]:
    raw = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def test_services_run_with_passive_openmp_waits_unless_told_otherwise(stack, tiny_pair, tmp_path, token_file):
    expected = os.environ.get("OMP_WAIT_POLICY", "PASSIVE")
    for name, service in stack.services.items():
        assert environment(service.process.pid).get("OMP_WAIT_POLICY") == expected, name
    # an explicit setting wins; and `--api-keys " , "` (no key at all) is refused at start, not "auth off"
    target, _ = tiny_pair
    gateway = Service("gateway", ["--model", str(target), "--verifier", stack.verifier.address, "--api-keys", " , ",
                                  "--internal-token-file", str(token_file), "--peer-wait-s", "60"],
                      {**stack.env, "OMP_WAIT_POLICY": "ACTIVE"}, tmp_path)
    try:
        # (/proc/PID/environ can read empty for a moment right after the exec)
        assert wait_for(lambda: environment(gateway.process.pid).get("OMP_WAIT_POLICY") == "ACTIVE", 10)
        code = wait_exit(gateway.process, 120)
        log = gateway.log()
        assert code == 2, log[-2000:]
        assert "--api-keys ' , ' names no key" in log, log[-2000:]
        print("figure: gateway --api-keys ' , ':", next(line for line in log.splitlines() if "names no key" in line))
    finally:
        gateway.stop()


def test_zz_the_gateway_is_usable_after_all_of_the_above(stack, gateway):
    response = gateway.Generate(gateway_pb2.GenerateRequest(prompt="ok", max_tokens=4), timeout=60)
    assert response.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED
    assert error_lines(stack) == []


def test_an_oversized_input_storm_costs_the_gateway_nothing(stack):
    """8 concurrent 4 MB prompts, then 8 concurrent 15 M-id prompts (15 MB each, under gRPC's 16 MiB cap):
    all refused for their size (INVALID_ARGUMENT unread; RESOURCE_EXHAUSTED by gRPC for 15 MB) within 1 s over
    what a bare gRPC server takes to refuse the same bytes, before any parse or tokenization; gateway health
    answers within 100 ms throughout, and its RSS rises by less than 100 MB.

    The suite's other worker shares the two cores, so health is held to 100 ms in 99% of the checks and 1 s in
    all (tools.oversize_storm.health_within_under_load); run by hand on a quiet machine, the tool holds every
    check to 100 ms."""
    from tools.oversize_storm import passed, storm

    result = storm(stack.gateway.address, stack.gateway.process.pid,
                   metadata=(("authorization", f"Bearer {API_KEY}"),))
    print(f"figure: oversized-input storm: {result}")
    assert passed(result, shared_cores=True) == dict.fromkeys(passed(result), True), result
    assert "refused unread" in result["waves"]["text"]["details"] or "characters" in result["waves"]["text"]["details"]


def test_a_storm_of_large_schemas_costs_the_gateway_nothing(stack):
    """50 concurrent requests, each with its own strict JSON Schema just under the constraint size limit (issue
    33): the gateway forwards them, the verifier compiles or refuses them as busy, and the gateway's health
    answers within 100 ms over a control's answer to the same check, throughout; its RSS rises by less than
    100 MB and no call fails with INTERNAL or UNKNOWN. Health under the suite's shared cores as in the storm above
    (every check within 100 ms when the tool is run by hand on a quiet machine)."""
    from tools.schema_storm import passed, storm

    result = storm(stack.gateway.address, stack.gateway.process.pid, schemas=50, idle_s=2.0,
                   metadata=(("authorization", f"Bearer {API_KEY}"),))
    print(f"figure: schema storm: {result}")
    assert passed(result, shared_cores=True) == dict.fromkeys(passed(result), True), result
    assert set(result["codes"]) <= {"OK", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"}, result
    assert max(result["schema_bytes"]) <= result["constraint_limit_bytes"] < 1.1 * min(result["schema_bytes"])
