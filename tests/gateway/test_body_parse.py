"""gateway.body_parse: a body is bounded by its JSON shape before the framework parses it (issue 32, defect 7)."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time

import pytest

from gateway.body_parse import BodyTooComplex, check_shape, max_values_for
from gateway.config import GatewayConfig
from gateway.generation import Generation
from gateway.http_server import start_http
from gateway.openai_api import ServedModel, create_app
from gateway.validation import ModelLimits
from specdec.runtime.config import ServerConfig
from specdec.runtime.limits import MAX_CONSTRAINT_BYTES


def chat(messages: int) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": "a"}] * messages}, separators=(",", ":")).encode()


def test_bodies_a_fitting_request_can_have_pass():
    limit = max_values_for(8192)
    check_shape(json.dumps({"prompt": list(range(8192)), "max_tokens": 4, "stop": ["x"] * 16}).encode(), limit)
    check_shape(json.dumps({"prompt": "字" * 500_000}).encode(), limit)
    check_shape(chat(5000), limit)
    check_shape(json.dumps({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                            "response_format": {"type": "text"}, "logit_bias": {}}).encode(), limit)


@pytest.mark.parametrize("body", [b"not json", b'{"a": 1} trailing', b"\xff\xfe\x00", b""])
def test_a_body_that_is_not_json_is_left_to_the_framework(body):
    check_shape(body, 10)


def test_many_values_are_refused_at_the_first_past_the_bound():
    with pytest.raises(BodyTooComplex) as raised:
        check_shape(chat(250_000), max_values_for(8192))
    assert raised.value.status == 413 and raised.value.code == "body_too_large"
    assert f"more than {max_values_for(8192):,} JSON values" in raised.value.message
    assert max_values_for(8192) == 4 * 8192 + 1024 + MAX_CONSTRAINT_BYTES // 2
    with pytest.raises(BodyTooComplex):  # constants are not counted one by one, but their arrays are
        check_shape(b"[" + b"null," * 80_000 + b"null]", max_values_for(8192))


def test_a_schema_at_the_constraint_limit_fits_beside_a_full_prompt():
    """A structured-outputs schema of up to MAX_CONSTRAINT_BYTES, of the smallest values JSON has, fits beside a
    prompt of the whole context: the schema's size is refused by name later (a 400), not as a body too large."""
    schema = {"enum": [0] * (MAX_CONSTRAINT_BYTES // 2 - 8)}
    assert len(json.dumps(schema, separators=(",", ":"))) <= MAX_CONSTRAINT_BYTES
    check_shape(json.dumps({"prompt": list(range(8192)), "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}).encode(), max_values_for(8192))


def test_deep_nesting_is_refused():
    with pytest.raises(BodyTooComplex) as raised:
        check_shape(b"[" * 5000 + b"]" * 5000, 10**6)
    assert raised.value.status == 400 and raised.value.code == "body_too_deep"


def test_a_huge_chat_body_does_not_stall_health():
    """250,000 one-character messages (7.5 MB, under the body's byte limit): /health keeps answering while the
    body is dealt with, and the body is refused for its shape. The client runs in this process too, so a stall
    shows as the longest time from one health answer to the next (the client cannot even ask meanwhile)."""
    body = chat(250_000)
    limits = ModelLimits(vocab_size=100, max_context=8192, max_token_chars=81)  # SmolLM2-135M's
    worst, answers, outcome = [0.0], [0], {}

    def calls(port):
        done = threading.Event()

        def send_body():
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            connection.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
            reply = connection.getresponse()
            outcome.update(status=reply.status, body=json.loads(reply.read()))
            done.set()

        sender = threading.Thread(target=send_body)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        sender.start()
        last = time.perf_counter()
        while not done.is_set():
            connection.request("GET", "/health")
            connection.getresponse().read()
            now = time.perf_counter()
            worst[0], last = max(worst[0], now - last), now
            answers[0] += 1
            time.sleep(0.01)
        sender.join()

    async def main():
        app = create_app(Generation(None, None, limits, GatewayConfig()), ServedModel("tiny", 8192), [])
        running = await start_http(app, ServerConfig(host="127.0.0.1", grace_s=1), 0)
        try:
            await asyncio.to_thread(calls, running.port)
        finally:
            await asyncio.wait_for(running.stop(), 10)

    asyncio.run(main())
    print(f"figure: longest time between health answers {worst[0] * 1000:.0f} ms ({answers[0]} answers); "
          f"body {outcome}")
    assert worst[0] < 0.4, f"health did not answer for {worst[0]:.2f} s while the body was parsed"
    assert outcome["status"] == 413 and outcome["body"]["error"]["code"] == "body_too_large"
