"""gateway.validation: limits that mean what they say (issue 13, items 1 and 9).

`--max-prompt-tokens` caps the prompt, never prompt plus max_tokens; the model's context caps the sum and
errors name each limit by its own name. A prompt that cannot fit is refused by its length alone.
"""

from __future__ import annotations

import pytest

from gateway.validation import InvalidRequest, ModelLimits, check_generate_request
from specdec.runtime.limits import MAX_CONSTRAINT_BYTES
from specdec.v1 import common_pb2, gateway_pb2

CAPPED = ModelLimits(vocab_size=100, max_context=64, max_prompt_tokens=10, max_token_chars=5, max_token_bytes=7)


def ids_request(n: int, max_tokens: int = 0) -> gateway_pb2.GenerateRequest:
    return gateway_pb2.GenerateRequest(prompt_token_ids=gateway_pb2.TokenIds(ids=[5] * n), max_tokens=max_tokens)


def test_max_prompt_tokens_caps_the_prompt_and_not_the_default_max_tokens():
    # 8 prompt tokens + the default max_tokens of 50 = 58 <= the context of 64: fine under a cap of 10
    decode = check_generate_request(ids_request(8), [5] * 8, CAPPED, 50, -1)
    assert decode.max_tokens == 50
    with pytest.raises(InvalidRequest) as raised:
        check_generate_request(ids_request(12), [5] * 12, CAPPED, 50, -1)
    assert str(raised.value) == "prompt_token_ids has 12 tokens; prompts may have at most 10 tokens (--max-prompt-tokens)"


def test_the_sum_is_held_to_the_models_context_and_named_so():
    with pytest.raises(InvalidRequest) as raised:
        check_generate_request(ids_request(8, max_tokens=60), [5] * 8, CAPPED, 50, -1)
    assert "max_tokens 60 plus 8 prompt tokens exceeds the model's context of 64 tokens" in str(raised.value)


def test_a_prompt_that_cannot_fit_is_refused_by_its_length():
    assert CAPPED.prompt_size_problem(ids_request(10)) is None
    assert CAPPED.prompt_size_problem(ids_request(11)) == \
        "prompt_token_ids has 11 ids; prompts may have at most 10 tokens (--max-prompt-tokens)"
    assert CAPPED.prompt_size_problem(gateway_pb2.GenerateRequest(prompt="x" * 50)) is None  # 10 tokens x 5 chars
    problem = CAPPED.prompt_size_problem(gateway_pb2.GenerateRequest(prompt="x" * 51))
    assert problem.startswith("prompt has 51 characters, more than any prompt of at most 10 tokens can have (50)")
    uncapped = ModelLimits(vocab_size=100, max_context=64, max_token_chars=5, max_token_bytes=7)
    assert "the model's context is 64 tokens" in uncapped.prompt_size_problem(ids_request(65))


def test_the_request_size_bound_holds_any_prompt_that_fits():
    fits = gateway_pb2.GenerateRequest(prompt="\U0001F600" * CAPPED.prompt_chars, stop=["\U0001F600" * 256] * 16)
    assert CAPPED.prompt_size_problem(fits) is None
    assert fits.ByteSize() <= CAPPED.request_bytes
    ids = ids_request(CAPPED.prompt_tokens)
    ids.prompt_token_ids.ids[:] = [2**31 - 1] * CAPPED.prompt_tokens
    assert ids.ByteSize() <= CAPPED.request_bytes
    fits.constraint.json_schema = "x" * MAX_CONSTRAINT_BYTES  # and a constraint of the largest size allowed
    assert fits.ByteSize() <= CAPPED.request_bytes


def test_a_constraint_over_the_size_limit_is_refused_by_name_before_the_verifier():
    request = ids_request(8)
    request.constraint.CopyFrom(common_pb2.Constraint(json_schema=" " * MAX_CONSTRAINT_BYTES))
    assert check_generate_request(request, [5] * 8, CAPPED, 50, -1).constraint == request.constraint
    request.constraint.json_schema += "{}"
    with pytest.raises(InvalidRequest) as raised:
        check_generate_request(request, [5] * 8, CAPPED, 50, -1)
    assert str(raised.value).startswith(f"constraint.json_schema is {MAX_CONSTRAINT_BYTES + 2:,} bytes, over the limit "
                                        f"of {MAX_CONSTRAINT_BYTES} bytes")
    request.constraint.CopyFrom(common_pb2.Constraint(choice=common_pb2.Choices(values=["é" * 20_000] * 2)))
    with pytest.raises(InvalidRequest, match="constraint.choice is 80,000 bytes"):  # UTF-8 bytes, all choices
        check_generate_request(request, [5] * 8, CAPPED, 50, -1)


def test_an_unset_max_tokens_is_held_to_the_room_the_prompt_leaves():
    """As vLLM does: the default never refuses a prompt that fits; a value the client set is not held."""
    uncapped = ModelLimits(vocab_size=100, max_context=64)
    assert check_generate_request(ids_request(20), [5] * 20, uncapped, 256, -1).max_tokens == 44
    assert check_generate_request(ids_request(63), [5] * 63, uncapped, 256, -1).max_tokens == 1
    assert check_generate_request(ids_request(8), [5] * 8, uncapped, 16, -1).max_tokens == 16
    with pytest.raises(InvalidRequest) as raised:
        check_generate_request(ids_request(64), [5] * 64, uncapped, 256, -1)
    assert str(raised.value) == ("prompt_token_ids has 64 tokens, which fill the model's context of 64 tokens and "
                                 "leave no room for output")
    with pytest.raises(InvalidRequest, match="max_tokens 45 plus 20 prompt tokens exceeds"):
        check_generate_request(ids_request(20, max_tokens=45), [5] * 20, uncapped, 256, -1)


def test_a_conversation_that_cannot_fit_is_refused_before_its_template_renders():
    assert CAPPED.messages_size_problem(["a"] * 10) is None
    assert CAPPED.messages_size_problem(["a"] * 11) == \
        "messages has 11 messages; prompts may have at most 10 tokens (--max-prompt-tokens)"
    assert CAPPED.messages_size_problem(["x" * 30, "x" * 21]).startswith("messages have 51 characters")
