"""Bad input at every boundary: each field of every RPC gets the right status and a message naming the field.

The first tables run the validators in-process (fast). The `slow` ones send the same
kinds of requests to the real processes: Gateway.Generate/GenerateStream,
VerifierService.Decode and DraftService.Propose, messages over the size limit, and
a draft/target pair whose tokenizers differ at start-up.
"""

from __future__ import annotations

import math

import grpc
import pytest

from gateway.validation import InvalidRequest as GatewayInvalid
from gateway.validation import ModelLimits, check_generate_request
from specdec.runtime import limits
from specdec.decoding.sampling import MIN_TEMPERATURE, SamplingParams
from devkit.testing import build_other_tokenizer_model
from specdec.v1 import (
    common_pb2,
    draft_pb2,
    draft_pb2_grpc,
    gateway_pb2,
    gateway_pb2_grpc,
    verifier_pb2,
    verifier_pb2_grpc,
)
from tests.reliability.support import Service, gauge, wait_exit, wait_for
from verifier_service.validation import InvalidRequest as VerifierInvalid
from verifier_service.validation import check_decode_request

VOCAB, CONTEXT = 320, 512
MiB = 1024 * 1024
G = gateway_pb2.GenerateRequest
ids = gateway_pb2.TokenIds

# field named in the message -> a request that is wrong in that field only
GATEWAY_BAD = [
    ("prompt", G(prompt="")),
    ("prompt or prompt_token_ids", G()),
    ("prompt_token_ids", G(prompt_token_ids=ids(ids=[]))),
    ("prompt_token_ids", G(prompt_token_ids=ids(ids=[1, 10_000_000]))),
    ("prompt_token_ids", G(prompt_token_ids=ids(ids=[-1]))),
    ("prompt_token_ids", G(prompt_token_ids=ids(ids=[VOCAB]))),
    ("prompt", G(prompt="x" * (limits.MAX_PROMPT_CHARS + 1))),
    ("temperature", G(prompt="hi", temperature=-1.0)),
    ("temperature", G(prompt="hi", temperature=math.nan)),
    ("temperature", G(prompt="hi", temperature=math.inf)),
    ("temperature", G(prompt="hi", temperature=1e-30)),
    ("top_p", G(prompt="hi", temperature=1.0, top_p=0.0)),
    ("top_p", G(prompt="hi", temperature=1.0, top_p=1.5)),
    ("top_p", G(prompt="hi", temperature=1.0, top_p=math.nan)),
    ("top_k", G(prompt="hi", top_k=-3)),
    ("max_tokens", G(prompt="hi", max_tokens=1_000_000)),
    ("prompt_token_ids", G(prompt_token_ids=ids(ids=[5] * 600), max_tokens=1)),  # longer than the context
    ("stop", G(prompt="hi", stop=[""])),
    ("stop", G(prompt="hi", stop=["x"] * (limits.MAX_STOP_STRINGS + 1))),
    ("stop", G(prompt="hi", stop=["x" * (limits.MAX_STOP_LENGTH + 1)])),
]
# checked by the verifier, passed through by the gateway
GATEWAY_BAD_AT_VERIFIER = [
    ("num_speculative_tokens", G(prompt="hi", num_speculative_tokens=1000)),
]
# edge values that are valid and must work
GATEWAY_EDGE_OK = [
    G(prompt="hi", max_tokens=1),
    G(prompt="hi", max_tokens=3, temperature=1.0, seed=2**64 - 1),
    G(prompt="hi", max_tokens=3, temperature=MIN_TEMPERATURE),
    G(prompt="hi", max_tokens=3, temperature=3e38, top_k=10**9, top_p=1e-30),
    G(prompt="hi", max_tokens=3, num_speculative_tokens=0),
    G(prompt="hi", max_tokens=3, num_speculative_tokens=16),
    G(prompt="hi", max_tokens=3, stop=["東京", "🙂"] * 8),
    G(prompt_token_ids=ids(ids=[0, VOCAB - 1]), max_tokens=3),
    G(prompt="\x00\udcff".encode("utf-8", "surrogatepass").decode("utf-8", "replace"), max_tokens=3),
]

D = verifier_pb2.DecodeRequest
S = common_pb2.SamplingParams
VERIFIER_BAD = [
    ("prompt_token_ids", D(prompt_token_ids=[], max_tokens=4)),
    ("prompt_token_ids", D(prompt_token_ids=[VOCAB], max_tokens=4)),
    ("prompt_token_ids", D(prompt_token_ids=[-5], max_tokens=4)),
    ("sampling.temperature", D(prompt_token_ids=[5], max_tokens=4, sampling=S(temperature=-1))),
    ("sampling.temperature", D(prompt_token_ids=[5], max_tokens=4, sampling=S(temperature=1e-38))),
    ("sampling.top_p", D(prompt_token_ids=[5], max_tokens=4, sampling=S(temperature=1, top_p=2))),
    ("sampling.top_k", D(prompt_token_ids=[5], max_tokens=4, sampling=S(top_k=-1))),
    ("max_tokens", D(prompt_token_ids=[5], max_tokens=0)),
    ("max_tokens", D(prompt_token_ids=[5], max_tokens=CONTEXT)),
    ("stop", D(prompt_token_ids=[5], max_tokens=4, stop=["a"] * 17)),
    ("stop", D(prompt_token_ids=[5], max_tokens=4, stop=[""])),
    ("num_speculative_tokens", D(prompt_token_ids=[5], max_tokens=4, num_speculative_tokens=17)),
    # client strings that reach the logs: a newline would forge a log line
    ("request_id", D(request_id="r\n2099-01-01 CRITICAL forged", prompt_token_ids=[5], max_tokens=4)),
    ("request_id", D(request_id="r" * (limits.MAX_REQUEST_ID_LENGTH + 1), prompt_token_ids=[5], max_tokens=4)),
    ("tenant", D(tenant="t\x1b[2J", prompt_token_ids=[5], max_tokens=4)),
]

P = draft_pb2.ProposeRequest


def start(prompt=(5, 6, 7), **sampling):
    return P(start=draft_pb2.StartSequence(request_id="t", prompt_token_ids=list(prompt), sampling=S(**sampling)))


def nxt(keep, append=(), k=2):
    return P(next=draft_pb2.NextBlock(keep_length=keep, append_token_ids=list(append), num_tokens=k))


# (case, messages, code, words the message must contain)
DRAFT_BAD = [
    ("first message is next", [nxt(0, [5])], grpc.StatusCode.INVALID_ARGUMENT, "first Propose message must be `start`"),
    ("empty prompt", [start(())], grpc.StatusCode.INVALID_ARGUMENT, "start.prompt_token_ids"),
    ("out-of-vocab prompt", [start((5, VOCAB))], grpc.StatusCode.INVALID_ARGUMENT, "start.prompt_token_ids"),
    ("prompt longer than the draft", [start([5] * (CONTEXT + 1))], grpc.StatusCode.INVALID_ARGUMENT,
     "start.prompt_token_ids"),
    ("bad sampling", [start(temperature=1, top_p=0)], grpc.StatusCode.INVALID_ARGUMENT, "start.sampling"),
    ("keep_length past the sequence", [start(), nxt(10_000)], grpc.StatusCode.INVALID_ARGUMENT, "keep_length"),
    ("out-of-vocab append", [start(), nxt(3, [VOCAB])], grpc.StatusCode.INVALID_ARGUMENT, "append_token_ids"),
    ("k over the maximum", [start(), nxt(3, [], 1000)], grpc.StatusCode.INVALID_ARGUMENT, "num_tokens"),
    ("past the context", [start(), nxt(3, [5] * CONTEXT)], grpc.StatusCode.OUT_OF_RANGE, "append_token_ids"),
    ("a second start", [start(), start()], grpc.StatusCode.INVALID_ARGUMENT, "after `start`"),
    ("a newline in request_id", [P(start=draft_pb2.StartSequence(request_id="r\nCRITICAL forged",
                                                                 prompt_token_ids=[5, 6, 7]))],
     grpc.StatusCode.INVALID_ARGUMENT, "start.request_id"),
    ("longer than the target's context", [P(start=draft_pb2.StartSequence(prompt_token_ids=[5] * 40,
                                                                          max_context=32))],
     grpc.StatusCode.INVALID_ARGUMENT, "start.max_context 32"),
]


# ---------------------------------------------------------------- in-process: the validators


@pytest.mark.parametrize("field,request_", GATEWAY_BAD, ids=[f"{f}-{i}" for i, (f, _) in enumerate(GATEWAY_BAD)])
def test_gateway_validator_names_the_field(field, request_):
    prompt_ids = list(request_.prompt_token_ids.ids) if request_.WhichOneof("input") == "prompt_token_ids" else [5]
    if field == "prompt" and request_.prompt:
        pytest.skip("the character limit is checked before tokenizing, in the servicer")
    with pytest.raises(GatewayInvalid) as raised:
        check_generate_request(request_, prompt_ids, ModelLimits(VOCAB, CONTEXT), 256, -1)
    assert field in str(raised.value)


@pytest.mark.parametrize("field,request_", VERIFIER_BAD, ids=[f"{f}-{i}" for i, (f, _) in enumerate(VERIFIER_BAD)])
def test_verifier_validator_names_the_field(field, request_):
    with pytest.raises(VerifierInvalid) as raised:
        check_decode_request(request_, VOCAB, CONTEXT, 16)
    assert field in str(raised.value)


def test_temperature_floor():
    assert SamplingParams(temperature=0.0).problems() == []
    assert SamplingParams(temperature=MIN_TEMPERATURE).problems() == []
    assert "temperature must be 0 (greedy) or at least" in SamplingParams(temperature=1e-30).problems()[0]


# ---------------------------------------------------------------- through the real processes


def _assert_status(raised, code, words):
    assert raised.value.code() == code, (raised.value.code(), raised.value.details())
    assert words in raised.value.details(), raised.value.details()


@pytest.mark.slow
@pytest.mark.parametrize("streaming", [False, True], ids=["Generate", "GenerateStream"])
def test_gateway_rejects_each_bad_field(gateway_channel, streaming):
    stub = gateway_pb2_grpc.GatewayStub(gateway_channel)
    if streaming:
        def call(r):
            return list(stub.GenerateStream(r, timeout=30))
    else:
        def call(r):
            return stub.Generate(r, timeout=30)
    for field, request in GATEWAY_BAD + GATEWAY_BAD_AT_VERIFIER:
        with pytest.raises(grpc.RpcError) as raised:
            call(request)
        _assert_status(raised, grpc.StatusCode.INVALID_ARGUMENT, field)
    # edge values are valid; and after all of the above, the service still serves
    for request in GATEWAY_EDGE_OK:
        response = stub.Generate(request, timeout=60)
        assert response.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED, request
        assert response.usage.completion_tokens == len(response.token_ids) >= 1


@pytest.mark.slow
def test_verifier_rejects_each_bad_field(main_stack):
    with grpc.insecure_channel(main_stack.verifier.address) as channel:
        stub = verifier_pb2_grpc.VerifierServiceStub(channel)
        for field, request in VERIFIER_BAD:
            with pytest.raises(grpc.RpcError) as raised:
                list(stub.Decode(request, timeout=30))
            _assert_status(raised, grpc.StatusCode.INVALID_ARGUMENT, field)
        good = list(stub.Decode(D(prompt_token_ids=[5, 6], max_tokens=3), timeout=60))
        assert good[-1].finish_reason and sum(len(m.token_ids) for m in good) == good[-1].usage.completion_tokens


@pytest.mark.slow
def test_draft_rejects_each_bad_stream(main_stack):
    with grpc.insecure_channel(main_stack.draft.address) as channel:
        stub = draft_pb2_grpc.DraftServiceStub(channel)
        for case, messages, code, words in DRAFT_BAD:
            with pytest.raises(grpc.RpcError) as raised:
                list(stub.Propose(iter(messages), timeout=30))
            assert raised.value.code() == code, (case, raised.value.code(), raised.value.details())
            assert words in raised.value.details(), (case, raised.value.details())
        # an empty stream is a no-op, and a good one works
        assert list(stub.Propose(iter([]), timeout=30)) == []
        replies = list(stub.Propose(iter([start(), nxt(3, [], 2), nxt(4, [9], 2)]), timeout=30))
        assert len(replies) == 2 and replies[-1].sequence_length >= 5
        # the largest seed is valid: the model draft keys its draws by (seed, position), any 64-bit seed
        assert len(list(stub.Propose(iter([start(temperature=1.0, seed=2**64 - 1), nxt(3)]), timeout=30))) == 1
    # every refused stream freed its sequence
    assert wait_for(lambda: gauge(main_stack.draft) == 0, 10)


def _raw_call(channel, kind: str, method: str, payload: bytes, metadata=()):
    identity = {"request_serializer": None, "response_deserializer": None}
    if kind == "unary":
        return channel.unary_unary(method, **identity)(payload, timeout=60, metadata=metadata)
    if kind == "stream":
        return list(channel.unary_stream(method, **identity)(payload, timeout=60, metadata=metadata))
    return list(channel.stream_stream(method, **identity)(iter([payload]), timeout=60, metadata=metadata))


@pytest.mark.slow
def test_oversized_messages_are_resource_exhausted(main_stack, gateway_channel):
    """Every service refuses a message over --max-message-mb (16 MiB by default) before parsing it."""
    big = 17 * MiB
    cases = [
        (gateway_channel, "unary", "/specdec.v1.Gateway/Generate", G(prompt="a" * big).SerializeToString()),
        (None, "stream", "/specdec.v1.VerifierService/Decode",
         D(prompt_token_ids=[5] * big, max_tokens=1).SerializeToString()),
        (None, "bidi", "/specdec.v1.DraftService/Propose", start([5] * big).SerializeToString()),
    ]
    addresses = {"/specdec.v1.VerifierService/Decode": main_stack.verifier.address,
                 "/specdec.v1.DraftService/Propose": main_stack.draft.address}
    for channel, kind, method, payload in cases:
        assert len(payload) > 16 * MiB
        own = channel is None
        channel = grpc.insecure_channel(addresses[method]) if own else channel
        try:
            with pytest.raises(grpc.RpcError) as raised:
                _raw_call(channel, kind, method, payload)
            assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (method, raised.value.details())
        finally:
            if own:
                channel.close()
    # and the gateway still answers
    stub = gateway_pb2_grpc.GatewayStub(gateway_channel)
    assert stub.Generate(G(prompt="ok", max_tokens=2), timeout=60).usage.completion_tokens >= 1


@pytest.mark.slow
def test_mismatched_tokenizers_refuse_to_start(main_stack, tiny_pair, tmp_path):
    """A draft with another tokenizer: the verifier and the gateway exit with code 2 and say what differs."""
    target, _ = tiny_pair
    other = build_other_tokenizer_model(tmp_path / "models")
    env = main_stack.env
    draft = Service("draft_service", ["--model", str(other), "--method", "ngram"], env, tmp_path)
    processes = {}
    try:
        processes["verifier"] = Service(
            "verifier_service", ["--model", str(target), "--draft", draft.address, "--draft-wait-s", "200"], env,
            tmp_path)
        processes["gateway with the other draft"] = Service(
            "gateway", ["--model", str(target), "--verifier", main_stack.verifier.address, "--draft", draft.address,
                        "--peer-wait-s", "200"], env, tmp_path)
        processes["gateway with the other tokenizer"] = Service(
            "gateway", ["--model", str(other), "--verifier", main_stack.verifier.address, "--peer-wait-s", "200"],
            env, tmp_path)
        for name, service in processes.items():
            code = wait_exit(service.process, 200)
            log = service.log()
            assert code == 2, f"{name}: exit {code}\n{log[-2000:]}"
            assert "does not share" in log and "tokenizer" in log, f"{name}:\n{log[-2000:]}"
            assert "vocabulary size 300 != 320" in log, f"{name}:\n{log[-2000:]}"
            print(f"figure: {name}: exit {code}:", next(line for line in log.splitlines() if "ERROR" in line))
        assert "the gateway's --model" in processes["gateway with the other tokenizer"].log()
        assert "does not share the verifier's tokenizer" in processes["gateway with the other tokenizer"].log()
    finally:
        for service in [*processes.values(), draft]:
            service.stop()
