"""gateway.openai_api: every bad input is a 4xx with OpenAI's error object, and the API behaves as OpenAI's and
vLLM's do where a client can tell.

Both front doors run in this process over a fake verifier (tests/gateway/fake_verifier.py), so what is checked
is the gateway's own handling: the table of bad bodies (400 naming the field by its dotted path, never a 500 or
an ERROR log line), strict types, `name` on chat messages, an unset max_tokens held to the room the prompt
leaves, Retry-After on 429, 405's type, /openapi.json behind the key, and a client that leaves during the
prefill ending the verifier's call at once, on HTTP and on gRPC.
"""

from __future__ import annotations

import json
import logging
import socket
import time
import urllib.error
import urllib.request

import grpc
import openai
import pytest

from devkit.testing import build_tokenizer
from specdec.v1 import gateway_pb2, gateway_pb2_grpc
from tests.gateway.fake_verifier import CHATML, CONTEXT, KEY, MODEL, FakeVerifier, gateway_in_thread
from tests.reliability.support import wait_for

HI = [{"role": "user", "content": "Hi"}]
# How soon the verifier's call must end once the client has gone (the fake's prefill lasts PREFILL_S).
CANCEL_BOUND_S = 3.0
PREFILL_S = 30.0


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    tokenizer = build_tokenizer(tmp_path_factory.mktemp("tokenizer"))
    tokenizer.chat_template = CHATML
    return tokenizer


@pytest.fixture(scope="module")
def gateway(tokenizer):
    with gateway_in_thread(tokenizer, FakeVerifier()) as running:
        yield running


def call(gateway, method: str, path: str, body=None, key: str | None = KEY) -> tuple[int, dict, dict]:
    """(status, headers, JSON body). `body`: a dict sent as JSON (ASCII, so a lone surrogate travels as \\ud800)."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(gateway.base_url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, dict(reply.headers), json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


def client(gateway, **options) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url + "/v1", api_key=KEY, max_retries=0, **options)


def completion(**fields) -> tuple[str, dict]:
    return "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2, **fields}


def chat(**fields) -> tuple[str, dict]:
    return "/v1/chat/completions", {"model": MODEL, "messages": HI, "max_tokens": 2, **fields}


def message(**fields) -> tuple[str, dict]:
    return chat(messages=[{"role": "user", "content": "Hi", **fields}])


# (case, (path, body), the param the 400 must name)
BAD_BODIES = [
    # a lone surrogate: valid JSON, not text (was a 500 with a traceback)
    ("surrogate in prompt", completion(prompt="a\ud800b"), "prompt"),
    ("surrogate in a prompt list", completion(prompt=["a\udfffb"]), "prompt.0"),
    ("surrogate in chat content", message(content="a\ud800b"), "messages.0.content"),
    ("surrogate in a content part", message(content=[{"type": "text", "text": "\ud800"}]), "messages.0.content.0.text"),
    ("surrogate in stop", completion(stop="\ud800"), "stop"),
    ("surrogate in a stop list", completion(stop=["ok", "x\udc00"]), "stop.1"),
    ("surrogate in model", completion(model="tiny\ud800"), "model"),
    ("surrogate in name", message(name="\ud800"), "messages.0.name"),
    ("surrogate in an unknown field's name", completion(**{"x\ud800": 1}), "x\\ud800"),
    # numbers the contract's int32 fields cannot hold (were a 500: "Value out of range")
    ("token id 2**40", completion(prompt=[2**40]), "prompt.0"),
    ("token id 2**40 in a batch of one", completion(prompt=[[5, 2**40]]), "prompt.0.1"),
    ("token id -2**40", completion(prompt=[-(2**40)]), "prompt.0"),
    ("top_k 2**40", completion(top_k=2**40), "top_k"),
    ("top_k -2**40", chat(top_k=-(2**40)), "top_k"),
    # loose coercion (was accepted: "5" as 5, true as 1, "yes" as true)
    ("max_tokens as a string", chat(max_tokens="5"), "max_tokens"),
    ("max_tokens true", chat(max_tokens=True), "max_tokens"),
    ("max_tokens 2.0", completion(max_tokens=2.0), "max_tokens"),
    ("stream yes", chat(stream="yes"), "stream"),
    ("stream 1", completion(stream=1), "stream"),
    ("temperature as a string", completion(temperature="0.5"), "temperature"),
    ("temperature true", chat(temperature=True), "temperature"),
    ("seed as a string", chat(seed="7"), "seed"),
    ("include_usage 1", chat(stream=True, stream_options={"include_usage": 1}), "stream_options.include_usage"),
    # param: the field's dotted path, no pydantic branch names (was "messages.0.content.str", "prompt.str")
    ("content a number", message(content=5), "messages.0.content"),
    ("prompt a number", completion(prompt=5), "prompt"),
    ("a part of another type", message(content=[{"type": "image_url", "text": "x"}]), "messages.0.content.0.type"),
    ("role unknown", message(role="robot"), "messages.0.role"),
    ("an unknown message field", message(mood="happy"), "messages.0.mood"),
    ("no messages", ("/v1/chat/completions", {"model": MODEL}), "messages"),
    # checked past the models, named the same way
    ("token id outside the vocabulary", completion(prompt=[5, 100_000]), "prompt"),
    ("max_tokens past the context", chat(max_tokens=CONTEXT), "max_tokens"),
]
# not JSON, or not an object: no field to name (was param "28", a byte offset)
BAD_JSON = [
    ("cut short", b'{"model": "tiny", "prompt": '),
    ("not JSON", b"prompt=Hi"),
    ("an array", b"[1, 2]"),
    ("null", b"null"),
    ("not UTF-8", b'{"model": "tiny", "prompt": "a\xffb"}'),
    ("nested 100,000 deep", b'{"model": "tiny", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    ("an integer of 5,000 digits", b'{"model": "tiny", "prompt": "Hi", "seed": ' + b"9" * 5000 + b"}"),
]


def assert_error_object(status: int, body: dict, expected_status: int, error_type: str = "invalid_request_error"):
    assert status == expected_status, body
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["type"] == error_type, body


@pytest.mark.parametrize("case,request_,param", BAD_BODIES, ids=[case for case, _, _ in BAD_BODIES])
def test_bad_input_is_a_400_error_object_naming_the_field(gateway, caplog, case, request_, param):
    path, body = request_
    with caplog.at_level(logging.ERROR):
        status, _headers, reply = call(gateway, "POST", path, body)
    assert_error_object(status, reply, 400)
    assert reply["error"]["param"] == param, reply
    assert reply["error"]["message"], reply
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR], caplog.text


@pytest.mark.parametrize("case,body", BAD_JSON, ids=[case for case, _ in BAD_JSON])
def test_a_body_that_is_not_a_json_object_is_a_400_without_a_param(gateway, case, body):
    status, _headers, reply = call(gateway, "POST", "/v1/completions", body)
    assert_error_object(status, reply, 400)
    assert reply["error"]["param"] is None, reply


def test_the_openai_client_sees_the_status_and_param(gateway):
    api = client(gateway)
    cases = [
        (lambda: api.completions.create(model=MODEL, prompt=[2**40], max_tokens=2), "prompt.0"),
        (lambda: api.completions.create(model=MODEL, prompt="Hi", max_tokens=2, extra_body={"top_k": 2**40}), "top_k"),
        (lambda: api.chat.completions.create(model=MODEL, messages=HI, max_tokens="5"), "max_tokens"),
        (lambda: api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": 5}]),
         "messages.0.content"),
    ]
    for create, param in cases:
        with pytest.raises(openai.BadRequestError) as raised:
            create()
        assert raised.value.status_code == 400 and raised.value.param == param, raised.value.body
        assert raised.value.type == "invalid_request_error"


def test_numbers_stay_numbers(gateway):
    """Strict, as OpenAI is, but an integer is still a number: temperature 1 and top_p 1 are fine."""
    status, _headers, reply = call(gateway, "POST", *completion(temperature=1, top_p=1, seed=3, top_k=-1))
    assert status == 200, reply
    assert gateway.verifier.requests[-1].sampling.temperature == 1.0


def test_name_on_a_chat_message_is_accepted_and_given_to_the_template(gateway, tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi", "name": "ada"}]
    reply = client(gateway).chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert reply.choices[0].message.content
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert "<|im_start|>user ada\n" in rendered  # this template shows it; most ignore it
    assert list(gateway.verifier.requests[-1].prompt_token_ids) == tokenizer.encode(rendered, add_special_tokens=False)


def test_an_unset_max_tokens_is_held_to_the_room_the_prompt_leaves(gateway, tokenizer):
    """vLLM's rule: a default never refuses a prompt that fits; a max_tokens the client sent that cannot fit is
    refused, naming it."""
    messages = [{"role": "user", "content": "The quick brown fox jumps over the lazy dog."}]
    api = client(gateway)
    api.chat.completions.create(model=MODEL, messages=messages)  # --default-max-tokens 256 > CONTEXT
    sent = gateway.verifier.requests[-1]
    assert sent.max_tokens == CONTEXT - len(sent.prompt_token_ids) > 0
    api.completions.create(model=MODEL, prompt=[5] * (CONTEXT - 3))  # OpenAI's default of 16 > the room of 3
    assert gateway.verifier.requests[-1].max_tokens == 3
    api.completions.create(model=MODEL, prompt=[5] * 10)
    assert gateway.verifier.requests[-1].max_tokens == 16
    with pytest.raises(openai.BadRequestError) as raised:
        api.chat.completions.create(model=MODEL, messages=messages, max_tokens=CONTEXT)
    assert raised.value.param == "max_tokens"
    with pytest.raises(openai.BadRequestError) as raised:  # a prompt that fills the context leaves no room at all
        api.completions.create(model=MODEL, prompt=[5] * CONTEXT)
    assert raised.value.param == "prompt" and "no room for output" in raised.value.message


def test_a_429_says_when_to_retry(tokenizer):
    refusing = FakeVerifier(refuse=(grpc.StatusCode.RESOURCE_EXHAUSTED, "at --max-sequences 2; retry shortly"))
    with gateway_in_thread(tokenizer, refusing) as gateway:
        with pytest.raises(openai.RateLimitError) as raised:
            client(gateway).completions.create(model=MODEL, prompt="Hi", max_tokens=2)
        status, headers, body = call(gateway, "POST", *chat(stream=True))
    assert raised.value.status_code == 429 and raised.value.response.headers["retry-after"] == "1"
    assert_error_object(status, body, 429, "rate_limit_error")
    assert headers["retry-after"] == "1" and body["error"]["code"] == "capacity_exceeded"


def test_a_405_is_an_invalid_request(gateway):
    status, headers, body = call(gateway, "GET", "/v1/chat/completions")
    assert_error_object(status, body, 405)
    assert headers["allow"] == "POST"


def test_the_schema_needs_the_key_when_keys_are_set(gateway, tokenizer):
    status, _headers, body = call(gateway, "GET", "/openapi.json", key=None)
    assert_error_object(status, body, 401, "authentication_error")
    status, _headers, body = call(gateway, "GET", "/openapi.json")
    assert status == 200 and "/v1/chat/completions" in body["paths"]
    for path in ("/docs", "/redoc"):
        assert call(gateway, "GET", path)[0] == 404
    with gateway_in_thread(tokenizer, FakeVerifier(), api_keys=()) as open_gateway:  # no keys: open, as before
        status, _headers, body = call(open_gateway, "GET", "/openapi.json", key=None)
        assert status == 200 and "/v1/completions" in body["paths"]


class BrokenTokenizer:
    """The test tokenizer, except that encoding fails: a defect of the server, not of the request."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def __len__(self):
        return len(self._tokenizer)

    def encode(self, *args, **kwargs):
        raise RuntimeError("the tokenizer broke")


def test_a_defect_of_the_server_is_still_an_error_object(tokenizer):
    """A 500 is for the server's own faults; even then the client gets OpenAI's object, not plain text."""
    with gateway_in_thread(BrokenTokenizer(tokenizer), FakeVerifier()) as gateway:
        status, _headers, body = call(gateway, "POST", *completion())
    assert_error_object(status, body, 500, "server_error")
    assert "RuntimeError" in body["error"]["message"]


# ---------------------------------------------------------------- a client that leaves during the prefill


def assert_cancelled_soon(verifier: FakeVerifier, left: float) -> float:
    assert wait_for(lambda: verifier.cancelled, CANCEL_BOUND_S + 1), "the verifier's call was not cancelled"
    after = verifier.cancelled[0] - left
    assert after < CANCEL_BOUND_S, after
    return after


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_an_http_client_that_leaves_during_prefill_cancels_the_verifier_call(tokenizer, stream):
    verifier = FakeVerifier(prefill_s=PREFILL_S)
    with gateway_in_thread(tokenizer, verifier) as gateway:
        body = json.dumps({"model": MODEL, "prompt": "Hi", "max_tokens": 4, "stream": stream}).encode()
        with socket.create_connection(("127.0.0.1", gateway.http_port), timeout=10) as sock:
            sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {KEY}\r\n"
                         f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            assert wait_for(lambda: verifier.started, 10)
            time.sleep(0.2)  # well into the prefill
            left = time.monotonic()
        after = assert_cancelled_soon(verifier, left)
        print(f"figure: HTTP {'stream' if stream else 'whole'}: verifier call cancelled {after * 1000:.0f} ms after "
              f"the client left, {PREFILL_S:.0f} s prefill")


@pytest.mark.parametrize("method", ["GenerateStream", "Generate"])
def test_a_grpc_client_that_cancels_during_prefill_cancels_the_verifier_call(tokenizer, method):
    verifier = FakeVerifier(prefill_s=PREFILL_S)
    with gateway_in_thread(tokenizer, verifier) as gateway, grpc.insecure_channel(gateway.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        request = gateway_pb2.GenerateRequest(prompt="Hi", max_tokens=4)
        pending = stub.GenerateStream(request, timeout=60) if method == "GenerateStream" else \
            stub.Generate.future(request, timeout=60)
        assert wait_for(lambda: verifier.started, 10)
        time.sleep(0.2)
        left = time.monotonic()
        pending.cancel()
        after = assert_cancelled_soon(verifier, left)
        print(f"figure: gRPC {method}: verifier call cancelled {after * 1000:.0f} ms after the client cancelled")


# ---------------------------------------------------------------- the gRPC door: what can reach it


# (case, serialized GenerateRequest, words of the INVALID_ARGUMENT message). A gRPC client cannot put a lone
# surrogate in a proto string, but it can send bytes that are not UTF-8, and any value its int types hold.
G = gateway_pb2.GenerateRequest
GRPC_BAD = [
    ("prompt not UTF-8", b"\x0a\x03a\xffb", "bad UTF-8"),
    ("a surrogate's UTF-8 bytes", b"\x0a\x05a\xed\xa0\x80b", "bad UTF-8"),
    ("a stop string not UTF-8", G(prompt="Hi").SerializeToString() + b"\x42\x01\xff", "bad UTF-8"),
    ("token id int32 min", G(prompt_token_ids=gateway_pb2.TokenIds(ids=[-(2**31)])).SerializeToString(),
     "prompt_token_ids"),
    ("token id int32 max", G(prompt_token_ids=gateway_pb2.TokenIds(ids=[2**31 - 1])).SerializeToString(),
     "prompt_token_ids"),
    ("top_k int32 min", G(prompt="Hi", top_k=-(2**31)).SerializeToString(), "top_k"),
    ("max_tokens uint32 max", G(prompt="Hi", max_tokens=2**32 - 1).SerializeToString(), "max_tokens"),
]


@pytest.mark.parametrize("method", ["Generate", "GenerateStream"])
def test_grpc_bad_input_is_invalid_argument(gateway, method):
    with grpc.insecure_channel(gateway.grpc_address) as channel:
        raw = (channel.unary_unary if method == "Generate" else channel.unary_stream)(f"/specdec.v1.Gateway/{method}")
        for case, payload, words in GRPC_BAD:
            with pytest.raises(grpc.RpcError) as raised:
                reply = raw(payload, timeout=30)
                list(reply) if method == "GenerateStream" else reply
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (case, raised.value.details())
            assert words in raised.value.details(), (case, raised.value.details())
        # an unset max_tokens is held to the room the prompt leaves here too
        stub = gateway_pb2_grpc.GatewayStub(channel)
        reply = stub.Generate(G(prompt_token_ids=gateway_pb2.TokenIds(ids=[5] * (CONTEXT - 2))), timeout=30)
        assert reply.usage.completion_tokens == 3 and gateway.verifier.requests[-1].max_tokens == 2
