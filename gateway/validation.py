"""Check a GenerateRequest at the boundary; every problem names its field."""

from __future__ import annotations

import dataclasses

from specdec import limits, sampling
from specdec.v1 import gateway_pb2, verifier_pb2


class InvalidRequest(ValueError):
    """Maps to INVALID_ARGUMENT; the message names the field."""


@dataclasses.dataclass(frozen=True)
class ModelLimits:
    vocab_size: int
    max_context: int


def sampling_params(request: gateway_pb2.GenerateRequest) -> sampling.SamplingParams:
    return sampling.SamplingParams(
        temperature=request.temperature,
        top_p=request.top_p if request.HasField("top_p") else 1.0,
        top_k=request.top_k,
        seed=request.seed if request.HasField("seed") else None,
    )


def check_generate_request(request: gateway_pb2.GenerateRequest, prompt_ids: list[int] | None, limits_: ModelLimits,
                           default_max_tokens: int, default_k: int) -> verifier_pb2.DecodeRequest:
    """Turn a valid request into the verifier's DecodeRequest; raise InvalidRequest otherwise."""
    problems = []
    which = request.WhichOneof("input")
    if which is None:
        raise InvalidRequest("one of prompt or prompt_token_ids is required")
    if which == "prompt" and not request.prompt:
        raise InvalidRequest("prompt must not be empty")
    field = "prompt" if which == "prompt" else "prompt_token_ids"
    problems += limits.prompt_ids_problems(prompt_ids or [], limits_.vocab_size, field)
    params = sampling_params(request)
    problems += params.problems()
    max_tokens = request.max_tokens or default_max_tokens
    if prompt_ids and len(prompt_ids) + max_tokens > limits_.max_context:
        problems.append(f"max_tokens {max_tokens} plus {len(prompt_ids)} prompt tokens exceeds the model's "
                        f"context of {limits_.max_context} tokens")
    problems += limits.stop_problems(list(request.stop), "stop")
    if problems:
        raise InvalidRequest("; ".join(problems))
    decode = verifier_pb2.DecodeRequest(prompt_token_ids=prompt_ids, sampling=sampling.to_proto(params),
                                        max_tokens=max_tokens, stop=list(request.stop))
    if request.HasField("num_speculative_tokens"):
        decode.num_speculative_tokens = request.num_speculative_tokens
    elif default_k >= 0:
        decode.num_speculative_tokens = default_k
    return decode
