"""gateway.openai_protocol: OpenAI request bodies onto the Gateway contract, and our results into OpenAI's schema.

The response shapes are checked by the official `openai` package's own pydantic
types, so a field it would not parse fails here, not in a user's client.
"""

from __future__ import annotations

import json

import grpc
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from gateway import openai_protocol as protocol
from gateway.validation import ModelLimits, check_generate_request
from specdec.v1 import common_pb2, verifier_pb2

MESSAGES = [{"role": "user", "content": "Hi"}]


def chat(**fields) -> protocol.ChatCompletionRequest:
    return protocol.ChatCompletionRequest.model_validate({"model": "m", "messages": MESSAGES, **fields})


def completion(**fields) -> protocol.CompletionRequest:
    return protocol.CompletionRequest.model_validate({"model": "m", "prompt": "Hi", **fields})


def final_message(prompt_tokens=5, completion_tokens=3, reason=common_pb2.FINISH_REASON_LENGTH):
    return verifier_pb2.DecodeResponse(
        finish_reason=reason, usage=common_pb2.Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens),
        speculation=common_pb2.SpeculationStats(num_drafts=2, num_draft_tokens=8, num_accepted_tokens=3,
                                                accepted_per_position=[2, 1], num_rounds=3, num_fallback_rounds=1))


# ---------------------------------------------------------------- requests


def test_chat_fields_map_onto_the_gateway_request():
    request = protocol.generate_request(chat(temperature=0.5, top_p=0.9, seed=7, stop="END", max_completion_tokens=12,
                                    top_k=40, num_speculative_tokens=3), "PROMPT")
    assert request.prompt == "PROMPT"
    assert (request.max_tokens, request.top_k, request.seed, list(request.stop)) == (12, 40, 7, ["END"])
    assert request.temperature == pytest.approx(0.5) and request.top_p == pytest.approx(0.9)
    assert request.num_speculative_tokens == 3


def test_defaults_follow_openai_and_vllm():
    request = protocol.generate_request(chat(top_k=-1), "P")
    assert request.temperature == 1.0  # OpenAI's default
    assert request.top_k == 0  # vLLM's -1: keep every token
    assert not request.HasField("top_p") and not request.HasField("seed")
    assert not request.HasField("num_speculative_tokens")  # the server's (adaptive) default
    assert request.max_tokens == 0  # chat: the gateway's --default-max-tokens
    # completions: OpenAI's default of 16, as a default (held to the room the prompt leaves), not as a value sent
    assert protocol.generate_request(completion(), "P").max_tokens == 0
    assert protocol.default_max_tokens(completion()) == 16 and protocol.default_max_tokens(chat()) is None


def test_max_tokens_and_max_completion_tokens_must_agree():
    assert protocol.generate_request(chat(max_tokens=9), "P").max_tokens == 9
    assert protocol.generate_request(chat(max_tokens=9, max_completion_tokens=9), "P").max_tokens == 9
    with pytest.raises(protocol.OpenAIError) as info:
        protocol.generate_request(chat(max_tokens=9, max_completion_tokens=10), "P")
    assert (info.value.status, info.value.param) == (400, "max_tokens")


def test_completion_prompt_is_text_or_token_ids_but_one_prompt():
    assert protocol.completion_prompt(completion(prompt="abc")) == "abc"
    assert protocol.completion_prompt(completion(prompt=["abc"])) == "abc"
    assert protocol.completion_prompt(completion(prompt=[5, 6, 7])) == [5, 6, 7]
    assert list(protocol.generate_request(completion(prompt=[5, 6, 7]), [5, 6, 7]).prompt_token_ids.ids) == [5, 6, 7]
    with pytest.raises(protocol.OpenAIError) as info:
        protocol.completion_prompt(completion(prompt=["a", "b"]))
    assert (info.value.status, info.value.param) == (400, "prompt")


def test_the_mapped_request_passes_the_gateway_checks_into_the_verifier_request():
    request = protocol.generate_request(chat(temperature=0.7, top_p=0.8, seed=3, top_k=5, max_tokens=4), "P")
    decode = check_generate_request(request, [1, 2, 3], ModelLimits(vocab_size=100, max_context=64), 256, -1)
    sampling = decode.sampling
    assert sampling.temperature == pytest.approx(0.7) and sampling.top_p == pytest.approx(0.8)
    assert (sampling.top_k, sampling.seed, decode.max_tokens) == (5, 3, 4)
    greedy = check_generate_request(protocol.generate_request(chat(temperature=0), "P"), [1], ModelLimits(100, 64), 8, 4)
    assert not greedy.sampling.HasField("top_p") and not greedy.sampling.HasField("seed")
    assert (greedy.max_tokens, greedy.num_speculative_tokens) == (8, 4)


@pytest.mark.parametrize("fields, param", [
    ({"n": 2}, "n"),
    ({"logprobs": True}, "logprobs"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"frobnicate": 1}, "frobnicate"),
])
def test_unsupported_fields_are_refused_by_name(fields, param):
    problem = protocol.unsupported(chat(**fields))
    assert problem is not None and problem.status == 400 and problem.param == param
    assert param in problem.message


@pytest.mark.parametrize("fields", [
    {"n": 1}, {"logprobs": False}, {"logprobs": None}, {"tools": []}, {"presence_penalty": 0},
    {"repetition_penalty": 1.0}, {"user": "someone"}, {"response_format": {"type": "text"}},
    {"stream": True, "stream_options": {"include_usage": True}},
])
def test_fields_that_ask_for_nothing_extra_are_accepted(fields):
    assert protocol.unsupported(chat(**fields)) is None


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


@pytest.mark.parametrize("fields, expected", [
    ({"response_format": {"type": "json_object"}}, common_pb2.Constraint(json_object=True)),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA, "strict": True}}},
     common_pb2.Constraint(json_schema=json.dumps(SCHEMA), strict=True)),
    ({"structured_outputs": {"json": SCHEMA}}, common_pb2.Constraint(json_schema=json.dumps(SCHEMA))),
    ({"structured_outputs": {"regex": "[0-9]+"}}, common_pb2.Constraint(regex="[0-9]+")),
    ({"structured_outputs": {"choice": ["yes", "no"]}},
     common_pb2.Constraint(choice=common_pb2.Choices(values=["yes", "no"]))),
    ({"structured_outputs": {"grammar": 'root ::= "a"'}}, common_pb2.Constraint(grammar='root ::= "a"')),
])
def test_response_format_and_structured_outputs_map_onto_a_constraint(fields, expected):
    for body in (chat(**fields), completion(**fields)):
        assert protocol.unsupported(body) is None
        assert protocol.generate_request(body, "P").constraint == expected


def test_text_response_format_is_no_constraint():
    assert not protocol.generate_request(chat(response_format={"type": "text"}), "P").HasField("constraint")


@pytest.mark.parametrize("fields", [
    {"response_format": {"type": "json_schema"}},
    {"structured_outputs": {"regex": "a", "choice": ["a"]}},
    {"structured_outputs": {}},
    {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
])
def test_ambiguous_or_empty_constraints_are_a_400(fields):
    with pytest.raises(protocol.OpenAIError) as raised:
        protocol.generate_request(chat(**fields), "P")
    assert raised.value.status == 400 and raised.value.param in ("response_format", "structured_outputs")


def test_a_constraint_error_from_the_verifier_names_response_format():
    error = protocol.error_from_grpc(grpc.StatusCode.INVALID_ARGUMENT, "constraint.regex does not compile: x", True)
    assert (error.status, error.param) == (400, "response_format")


def test_neutral_values_do_not_let_true_pass_for_one():
    assert protocol.unsupported(chat(n=True)) is not None
    assert protocol.unsupported(completion(echo=0)) is not None  # echo must be false, not a number


def test_stream_options_need_stream():
    problem = protocol.unsupported(chat(stream_options={"include_usage": True}))
    assert problem is not None and problem.param == "stream_options"


@pytest.mark.parametrize("code, message, chat_, status, param", [
    (grpc.StatusCode.INVALID_ARGUMENT, "temperature must be a finite number >= 0, got -1.0", True, 400, "temperature"),
    (grpc.StatusCode.INVALID_ARGUMENT, "prompt must not be empty", True, 400, "messages"),
    (grpc.StatusCode.INVALID_ARGUMENT, "prompt_token_ids has 1 ids outside the vocabulary", False, 400, "prompt"),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "64 live sequences", True, 429, None),
    (grpc.StatusCode.UNAVAILABLE, "the verifier service is unavailable; retry shortly", False, 503, None),
    (grpc.StatusCode.DEADLINE_EXCEEDED, "deadline", False, 504, None),
    (grpc.StatusCode.INTERNAL, "boom", False, 500, None),
])
def test_core_errors_map_to_http_status_and_param(code, message, chat_, status, param):
    error = protocol.error_from_grpc(code, message, chat_)
    assert (error.status, error.param) == (status, param)
    body = error.body()["error"]
    assert body["message"] == message and set(body) == {"message", "type", "param", "code"}


# ---------------------------------------------------------------- responses


def test_speculation_statistics_follow_vllm_names_and_conventions():
    stats = common_pb2.SpeculationStats(num_drafts=5, num_draft_tokens=20, num_accepted_tokens=7,
                                        accepted_per_position=[4, 2, 1], num_rounds=6, num_fallback_rounds=1)
    spec = protocol.speculative_decoding(stats, requested_k=4)
    # rounds that accepted exactly j draft tokens, j = 0..k; the bonus token is not counted
    assert spec["acceptance_histogram"] == [1, 2, 1, 1, 0]
    assert sum(spec["acceptance_histogram"]) == spec["num_spec_steps"] == 5
    assert sum(j * n for j, n in enumerate(spec["acceptance_histogram"])) == spec["num_accepted_draft_tokens"] == 7
    assert spec["mean_acceptance_length"] == pytest.approx(1 + 7 / 5)  # includes the bonus token, as vLLM's
    assert spec["draft_acceptance_rate"] == pytest.approx(7 / 20)
    assert (spec["num_draft_tokens"], spec["num_spec_tokens"], spec["num_rounds"]) == (20, 4, 6)
    assert protocol.speculative_decoding(common_pb2.SpeculationStats(), None)["acceptance_histogram"] == [0]


def test_chat_response_parses_as_openai_chat_completion():
    reply = protocol.Reply(chat=True, model="m", return_token_ids=True)
    body = reply.full("Hello", [7, 8, 9], final_message(), [1, 2, 3, 4, 5])
    parsed = ChatCompletion.model_validate(body)
    assert parsed.id.startswith("chatcmpl-") and parsed.model == "m"
    assert parsed.choices[0].message.content == "Hello" and parsed.choices[0].message.role == "assistant"
    assert parsed.choices[0].finish_reason == "length"
    assert (parsed.usage.prompt_tokens, parsed.usage.completion_tokens, parsed.usage.total_tokens) == (5, 3, 8)
    assert body["choices"][0]["token_ids"] == [7, 8, 9] and body["prompt_token_ids"] == [1, 2, 3, 4, 5]
    assert body["metrics"]["speculative_decoding"]["num_draft_tokens"] == 8


def test_text_completion_parses_as_openai_completion():
    body = protocol.Reply(chat=False, model="m").full("Hi", [4], final_message(reason=common_pb2.FINISH_REASON_STOP), [1])
    parsed = Completion.model_validate(body)
    assert parsed.object == "text_completion" and parsed.id.startswith("cmpl-")
    assert parsed.choices[0].text == "Hi" and parsed.choices[0].finish_reason == "stop"
    assert "token_ids" not in body["choices"][0] and "prompt_token_ids" not in body


def test_stream_chunks_parse_and_concatenate_to_the_whole_text():
    reply = protocol.Reply(chat=True, model="m", include_usage=True)
    final = final_message()
    chunks = [reply.chunk("Hel", [7], prompt_ids=[1, 2]), reply.chunk("", [8]), reply.chunk("lo", [9], final),
              reply.usage_chunk(final)]
    parsed = [ChatCompletionChunk.model_validate(c) for c in chunks]
    assert parsed[0].choices[0].delta.role == "assistant"
    assert "".join(p.choices[0].delta.content or "" for p in parsed if p.choices) == "Hello"
    assert [p.choices[0].finish_reason for p in parsed[:3]] == [None, None, "length"]
    assert all(p.usage is None for p in parsed[:3]) and parsed[3].choices == []
    assert parsed[3].usage.total_tokens == 8 and len({p.id for p in parsed}) == 1
    assert chunks[3]["metrics"]["speculative_decoding"]["acceptance_histogram"] == [0, 1, 1]


def test_text_completion_chunks_carry_text_and_finish_reason_null_until_the_last():
    reply = protocol.Reply(chat=False, model="m", return_token_ids=True)
    chunk = reply.chunk("a", [5], prompt_ids=[1])
    # OpenAI streams finish_reason null until the end (the SDK builds stream chunks without validating)
    assert chunk["choices"][0] == {"index": 0, "text": "a", "logprobs": None, "finish_reason": None, "token_ids": [5]}
    assert chunk["object"] == "text_completion" and chunk["prompt_token_ids"] == [1] and "usage" not in chunk
    last = Completion.model_validate(reply.chunk("b", [6], final_message()))
    assert last.choices[0].text == "b" and last.choices[0].finish_reason == "length"


@pytest.mark.parametrize("body, param", [
    ('{"prompt": [1099511627776]}', "prompt.0"),
    ('{"prompt": [[5, 1099511627776]]}', "prompt.0.1"),
    ('{"prompt": "x", "stream": "yes"}', "stream"),
    ('{"prompt": "x", "max_tokens": true}', "max_tokens"),
    ('{"prompt": 5}', "prompt"),
    ('{"prompt": "x", "stop": ["a", 5]}', "stop.1"),
    ('{"prompt": "x", "model": "m", ', None),
])
def test_validation_errors_name_the_field_by_its_path_parsed_either_way(body, param):
    """The same 400 whether pydantic parsed the JSON (no "body" in loc) or FastAPI did (json.loads, then a dict)."""
    import json

    import pydantic

    parsed = [lambda: protocol.CompletionRequest.model_validate_json(body)]
    if param is not None:
        parsed.append(lambda: protocol.CompletionRequest.model_validate(json.loads(body)))
    for parse in parsed:
        with pytest.raises(pydantic.ValidationError) as raised:
            parse()
        error = protocol.error_from_validation(raised.value.errors())
        assert (error.status, error.param) == (400, param), error.body()
        assert error.message.startswith(param or "the request body is not valid JSON"), error.message
