"""Structured outputs through the three real processes (tiny seeded models, the transformers engine).

- Greedy output with a JSON schema, speculation on (n-gram and suffix drafts), equals the same request with
  speculation off, token for token, and parses and validates against the schema.
- Bad constraints are INVALID_ARGUMENT over gRPC and a 400 naming response_format through the openai client.
"""

from __future__ import annotations

import json

import grpc
import jsonschema
import openai
import pytest

from devkit.stack import running_stack
from specdec.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

pytestmark = pytest.mark.slow

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 999},
                                           "tags": {"type": "array", "items": {"enum": ["math", "code"]},
                                                    "maxItems": 3}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
PROMPTS = ['{"name": "Ada", "age": 36, "tags": ["math", "code"]}', "Hello", "SELECT id, name FROM users",
           '{"name": "Ada", "age":', "The quick brown fox", "def add(a, b):", "café", '{"tags": ["math", "code"]}']
MAX_TOKENS = 64


@pytest.fixture(scope="module", params=["ngram", "suffix"])
def stack(request, tiny_pair, tmp_path_factory):
    with running_stack(tiny_pair[0], tiny_pair[1], method=request.param,
                       log_dir=tmp_path_factory.mktemp("logs"), timeout_s=240) as services:
        with grpc.insecure_channel(services["gateway"].address) as channel:
            yield request.param, services, gateway_pb2_grpc.GatewayStub(channel), str(tiny_pair[0])


def generate(gateway, prompt: str, k: int, constraint: common_pb2.Constraint) -> gateway_pb2.GenerateResponse:
    return gateway.Generate(gateway_pb2.GenerateRequest(prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                                        num_speculative_tokens=k, constraint=constraint), timeout=120)


def test_greedy_json_schema_output_with_speculation_equals_k0_and_validates(stack):
    method, _services, gateway, _model = stack
    constraint = common_pb2.Constraint(json_schema=json.dumps(SCHEMA), strict=True)
    accepted = 0
    for prompt in PROMPTS:
        plain = generate(gateway, prompt, 0, constraint)
        assert plain.finish_reason == common_pb2.FINISH_REASON_STOP, f"{prompt!r}: {plain.text!r} did not end"
        jsonschema.validate(json.loads(plain.text), SCHEMA)
        for _ in range(2):  # the second pass: the suffix draft has learnt the first one's output
            fast = generate(gateway, prompt, 4, constraint)
            assert list(fast.token_ids) == list(plain.token_ids), (method, prompt)
            accepted += fast.speculation.num_accepted_tokens
    assert accepted > 0, "speculation never accepted a draft token: the test shows nothing"


@pytest.mark.parametrize("constraint, named", [
    (common_pb2.Constraint(json_schema='{"type": "object", "properties": {"a": {"type": 3}}}'),
     "constraint.json_schema does not compile"),
    (common_pb2.Constraint(json_schema='{"type": "integer", "multipleOf": 2}'), "unsupported keywords: multipleOf"),
    (common_pb2.Constraint(regex="[0-9"), "constraint.regex does not compile"),
    (common_pb2.Constraint(regex="a" * 70_000), "over the limit"),
])
def test_bad_constraints_are_invalid_argument_over_grpc(stack, constraint, named):
    with pytest.raises(grpc.RpcError) as raised:
        generate(stack[2], "Hello", 4, constraint)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT and named in raised.value.details()


@pytest.mark.parametrize("extra_body, named", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "constraint.json_schema does not compile"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "array", "uniqueItems": True}}}}, "unsupported keywords: uniqueItems"),
    ({"structured_outputs": {"regex": "(a"}}, "constraint.regex does not compile"),
    ({"structured_outputs": {"json": {"type": "string", "enum": ["x" * 70_000]}}}, "over the limit"),
])
def test_bad_constraints_are_a_400_through_the_openai_client(stack, extra_body, named):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{stack[1]['gateway'].http_port}/v1", api_key="none",
                           max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=stack[3], prompt="Hello", max_tokens=8, extra_body=extra_body)
    assert named in raised.value.message and raised.value.body["param"] == "response_format"


def test_openai_client_json_schema_output_validates(stack):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{stack[1]['gateway'].http_port}/v1", api_key="none",
                           max_retries=0, timeout=120)
    out = client.completions.create(
        model=stack[3], prompt="Hello", max_tokens=MAX_TOKENS, temperature=0,
        extra_body={"response_format": {"type": "json_schema",
                                        "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}})
    jsonschema.validate(json.loads(out.choices[0].text), SCHEMA)
    choice = client.completions.create(model=stack[3], prompt="Hello", max_tokens=8,
                                       temperature=1.0, extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert choice.choices[0].text in ("yes", "no")
