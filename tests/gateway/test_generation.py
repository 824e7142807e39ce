"""gateway.generation: what preparing one request may cost before any decoding (issue 32, defect 4)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gateway.config import GatewayConfig
from gateway.generation import Generation, GenerationError
from gateway.prompt_tokens import PIECE_CHARS
from gateway.validation import ModelLimits
from specdec.v1 import gateway_pb2


class DenseTokenizer:
    """Three tokens per character, as random CJK text is for byte-level BPE; records what it is given."""

    def __init__(self):
        self.seen: list[int] = []

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.seen.append(len(text))
        return [5] * (3 * len(text))


def test_a_prompt_that_tokenizes_far_past_the_context_is_refused_without_tokenizing_it_whole():
    tokenizer = DenseTokenizer()
    limits = ModelLimits(vocab_size=100, max_context=2048, max_token_chars=64)  # passes 131,072 characters
    generation = Generation(tokenizer, None, limits, GatewayConfig())
    prompt = "字" * 120_000  # under the character bound: 360,000 tokens, 175 times the context
    assert limits.prompt_size_problem(gateway_pb2.GenerateRequest(prompt=prompt)) is None
    with pytest.raises(GenerationError) as raised:
        asyncio.run(generation.prompt_ids(gateway_pb2.GenerateRequest(prompt=prompt, max_tokens=4)))
    assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.message.startswith("prompt has more than 2048 tokens")
    assert "the model's context is 2048 tokens" in raised.value.message
    assert max(tokenizer.seen) <= PIECE_CHARS, "the whole prompt was tokenized"


def test_a_prompt_that_fits_is_tokenized_whole():
    tokenizer = DenseTokenizer()
    generation = Generation(tokenizer, None, ModelLimits(vocab_size=100, max_context=64), GatewayConfig())
    ids = asyncio.run(generation.prompt_ids(gateway_pb2.GenerateRequest(prompt="abc")))
    assert ids == [5] * 9 and tokenizer.seen == [3]
