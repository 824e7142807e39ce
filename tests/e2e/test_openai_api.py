"""The OpenAI-compatible HTTP API end to end: the official `openai` package against the three real processes.

One stack for the module (tiny seeded models, model draft), its gateway serving
gRPC and HTTP in one process. What it shows:
- lossless across the front doors: at temperature 0 the chat and completions
  endpoints return exactly the token ids that gRPC Generate returns, streamed
  and not, for 20 prompts;
- the streamed deltas concatenate to the whole text, and the usage chunk is right;
- the error table through the openai client: 400 naming the field, 401, 404,
  429 (the verifier at --max-sequences), 503 (the verifier killed; last);
- a client that disconnects frees its sequence in the verifier.
"""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.error
import urllib.request

import grpc
import openai
import pytest

from devkit.stack import running_stack, scrape_metrics
from specdec.v1 import gateway_pb2, gateway_pb2_grpc

pytestmark = pytest.mark.slow

API_KEY = "sk-openai-e2e-5d1f"
MAX_TOKENS = 24
MAX_SEQUENCES = 2
PROMPTS = [
    "The quick brown fox jumps over the lazy dog. The quick",
    "def add(a, b):\n    return",
    "SELECT id, name FROM users WHERE",
    '{"name": "Ada", "age": 36, "tags": [',
    "Speculative decoding drafts tokens and",
    "for i in range(10): print(",
    "Ünïcödé: naïve café, 東京,",
    "Hello",
    "Write a haiku about caches.",
    "What is speculative decoding?",
    "The lazy dog sleeps while the quick brown fox",
    "ORDER BY name; SELECT",
    "emoji 🙂 and more.",
    "return a + b\n",
    "verifies them in one pass.",
    "Repeat after me: the quick brown fox, the quick brown fox,",
    "A",
    "tags: math, code, math, code,",
    "print(i * i) for i in",
    "Summarize: drafts are cheap, verification is exact.",
]
LONG = dict(prompt="Hello", max_tokens=400, temperature=0, extra_body={"num_speculative_tokens": 0})


def chatml(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


@dataclasses.dataclass
class Api:
    services: dict
    client: openai.OpenAI
    gateway: gateway_pb2_grpc.GatewayStub
    http_port: int
    model: str

    def generate(self, prompt: str, max_tokens: int = MAX_TOKENS) -> gateway_pb2.GenerateResponse:
        return self.gateway.Generate(gateway_pb2.GenerateRequest(prompt=prompt, max_tokens=max_tokens, temperature=0),
                                     timeout=120, metadata=[("authorization", f"Bearer {API_KEY}")])

    def client_with(self, **options) -> openai.OpenAI:
        return self.client.with_options(**options)

    def metric(self, service: str, name: str) -> float:
        return sum(v for (sample, _labels), v in scrape_metrics(self.services[service].metrics_port).items()
                   if sample == name)

    def wait_idle(self, timeout_s: float = 20.0) -> dict:
        """Live sequences in the gateway and the verifier, once both are 0 (or as they are at the deadline)."""
        deadline = time.monotonic() + timeout_s
        while True:
            live = {name: self.metric(name, "specdec_live_sequences") for name in ("gateway", "verifier")}
            if not any(live.values()) or time.monotonic() > deadline:
                return live
            time.sleep(0.1)


@pytest.fixture(scope="module")
def api(chat_target, tiny_pair, tmp_path_factory):
    with running_stack(chat_target, tiny_pair[1], method="model", gateway_args=["--api-keys", API_KEY],
                       # a generous draft timeout: a late block falls back, which is right but not tested here
                       verifier_args=["--max-sequences", str(MAX_SEQUENCES), "--draft-timeout-ms", "10000"],
                       log_dir=tmp_path_factory.mktemp("logs"), timeout_s=240) as services:
        http_port = services["gateway"].http_port
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key=API_KEY, max_retries=0,
                               timeout=120)
        with grpc.insecure_channel(services["gateway"].address) as channel:
            yield Api(services, client, gateway_pb2_grpc.GatewayStub(channel), http_port, str(chat_target))
        client.close()


def get(api, path: str) -> tuple[int, bytes]:
    """A plain GET without credentials: (status, body)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{api.http_port}{path}", timeout=10) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def extra(chunk_or_choice, name: str):
    return (chunk_or_choice.model_extra or {}).get(name)


def test_models_lists_the_served_model(api):
    models = api.client.models.list()
    assert [m.id for m in models.data] == [api.model]


@pytest.mark.parametrize("prompt", PROMPTS, ids=[f"p{i}" for i in range(len(PROMPTS))])
def test_chat_returns_the_tokens_grpc_generate_returns(api, prompt):
    want = api.generate(chatml(prompt))
    messages = [{"role": "user", "content": prompt}]
    whole = api.client.chat.completions.create(model=api.model, messages=messages, max_tokens=MAX_TOKENS,
                                               temperature=0, extra_body={"return_token_ids": True})
    choice = whole.choices[0]
    assert extra(choice, "token_ids") == list(want.token_ids)
    assert choice.message.content == want.text
    assert choice.finish_reason == ("length" if want.finish_reason == 2 else "stop")
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (want.usage.prompt_tokens,
                                                                          len(want.token_ids))

    chunks = list(api.client.chat.completions.create(
        model=api.model, messages=messages, max_completion_tokens=MAX_TOKENS, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"return_token_ids": True}))
    *deltas, usage_chunk = chunks
    assert [t for c in deltas for t in extra(c.choices[0], "token_ids")] == list(want.token_ids)
    assert "".join(c.choices[0].delta.content or "" for c in deltas) == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in deltas][-1] == choice.finish_reason
    assert usage_chunk.choices == [] and usage_chunk.usage.model_dump(exclude_none=True) == {
        "prompt_tokens": want.usage.prompt_tokens, "completion_tokens": len(want.token_ids),
        "total_tokens": want.usage.prompt_tokens + len(want.token_ids)}
    spec = extra(usage_chunk, "metrics")["speculative_decoding"]
    assert sum(spec["acceptance_histogram"]) == spec["num_spec_steps"]
    assert sum(j * n for j, n in enumerate(spec["acceptance_histogram"])) == spec["num_accepted_draft_tokens"]


def test_completions_return_the_tokens_grpc_generate_returns(api):
    for prompt in PROMPTS[:5]:
        want = api.generate(prompt)
        whole = api.client.completions.create(model=api.model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                              extra_body={"return_token_ids": True})
        assert extra(whole.choices[0], "token_ids") == list(want.token_ids) and whole.choices[0].text == want.text
        ids = extra(whole, "prompt_token_ids")
        streamed = list(api.client.completions.create(model=api.model, prompt=ids, max_tokens=MAX_TOKENS,
                                                      temperature=0, stream=True,
                                                      extra_body={"return_token_ids": True}))
        assert [t for c in streamed for t in extra(c.choices[0], "token_ids")] == list(want.token_ids)
        assert "".join(c.choices[0].text for c in streamed) == want.text


def test_speculation_off_is_the_same_tokens(api):
    want = api.generate(chatml(PROMPTS[0]))
    off = api.client.chat.completions.create(model=api.model, messages=[{"role": "user", "content": PROMPTS[0]}],
                                             max_tokens=MAX_TOKENS, temperature=0,
                                             extra_body={"return_token_ids": True, "num_speculative_tokens": 0,
                                                         "top_k": -1})
    assert extra(off.choices[0], "token_ids") == list(want.token_ids)
    assert extra(off, "metrics")["speculative_decoding"]["num_draft_tokens"] == 0


@pytest.mark.parametrize("fields, param", [
    ({"n": 2}, "n"),
    ({"logprobs": True}, "logprobs"),
    ({"tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]}, "tools"),
    ({"temperature": -1}, "temperature"),
    ({"messages": []}, "messages"),
])
def test_bad_fields_get_400_naming_the_field(api, fields, param):
    request = {"model": api.model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, **fields}
    with pytest.raises(openai.BadRequestError) as info:
        api.client.chat.completions.create(**request)
    assert info.value.status_code == 400
    assert info.value.param == param and param in info.value.message


def test_missing_or_wrong_key_gets_401(api):
    wrong = api.client_with(api_key="sk-wrong")
    with pytest.raises(openai.AuthenticationError) as info:
        wrong.models.list()
    assert info.value.status_code == 401 and info.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model=api.model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    status, body = get(api, "/v1/models")  # no Authorization header at all
    assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
    assert get(api, "/health")[0] == 200  # open, for probes


def test_unknown_model_gets_404(api):
    with pytest.raises(openai.NotFoundError) as info:
        api.client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Hi"}])
    assert info.value.status_code == 404 and info.value.code == "model_not_found" and info.value.param == "model"


def test_capacity_gets_429(api):
    held = [api.client.completions.create(model=api.model, stream=True, **LONG) for _ in range(MAX_SEQUENCES)]
    try:
        for stream in held:
            next(iter(stream))  # the verifier holds the sequence now
        with pytest.raises(openai.RateLimitError) as info:
            api.client.completions.create(model=api.model, prompt="Hi", max_tokens=2)
        assert info.value.status_code == 429 and "--max-sequences" in info.value.message
    finally:
        for stream in held:
            stream.close()
    assert api.wait_idle() == {"gateway": 0, "verifier": 0}


def test_disconnect_mid_stream_frees_the_sequence(api):
    assert api.wait_idle() == {"gateway": 0, "verifier": 0}
    finished_before = api.metric("verifier", "specdec_requests_total")
    stream = api.client.completions.create(model=api.model, stream=True, **LONG)
    chunks = iter(stream)
    next(chunks), next(chunks)
    assert api.metric("verifier", "specdec_live_sequences") == 1
    stream.close()  # the client goes away mid-stream
    assert api.wait_idle() == {"gateway": 0, "verifier": 0}
    # freed by the cancel, not by running to the end: the verifier never finished it
    assert api.metric("verifier", "specdec_requests_total") == finished_before


def test_disconnect_before_a_whole_response_frees_the_sequence(api):
    finished_before = api.metric("verifier", "specdec_requests_total")
    with pytest.raises(openai.APITimeoutError):
        api.client_with(timeout=0.5).completions.create(model=api.model, **LONG)
    assert api.wait_idle() == {"gateway": 0, "verifier": 0}
    assert api.metric("verifier", "specdec_requests_total") == finished_before


def test_verifier_down_gets_503(api):
    """Last: it kills the module's verifier."""
    assert get(api, "/health")[0] == 200
    api.services["verifier"].kill()
    # /health reports the gateway's verifier watch, as gRPC health does: it notices at the channel's state change
    deadline = time.monotonic() + 10
    while get(api, "/health")[0] == 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    status, body = get(api, "/health")
    assert status == 503 and json.loads(body)["error"]["code"] == "service_unavailable"
    with pytest.raises(openai.InternalServerError) as info:
        api.client.chat.completions.create(model=api.model, messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=4, temperature=0)
    assert info.value.status_code == 503 and "verifier" in info.value.message
    with pytest.raises(openai.InternalServerError) as info:
        api.client.chat.completions.create(model=api.model, messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=4, temperature=0, stream=True)
    assert info.value.status_code == 503
