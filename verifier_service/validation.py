"""Check a DecodeRequest at the boundary; every problem names its field."""

from __future__ import annotations

from specdec.runtime import limits
from specdec.decoding.sampling import from_proto
from specdec.v1 import verifier_pb2
from verifier_service.engines.decode_loop import DecodeSpec


class InvalidRequest(ValueError):
    """Maps to INVALID_ARGUMENT; the message names the field."""


def check_decode_request(request: verifier_pb2.DecodeRequest, vocab_size: int, max_context: int,
                         max_k: int) -> DecodeSpec:
    prompt = list(request.prompt_token_ids)
    problems = limits.prompt_ids_problems(prompt, vocab_size, "prompt_token_ids")
    sampling = from_proto(request.sampling)
    problems += [f"sampling.{p}" for p in sampling.problems()]
    if request.max_tokens < 1:
        problems.append("max_tokens must be >= 1")
    elif len(prompt) + request.max_tokens > max_context:
        problems.append(f"max_tokens {request.max_tokens} plus {len(prompt)} prompt tokens exceeds the model's "
                        f"context of {max_context} tokens")
    problems += limits.stop_problems(list(request.stop), "stop")
    k = request.num_speculative_tokens if request.HasField("num_speculative_tokens") else None
    if k is not None and k > max_k:
        problems.append(f"num_speculative_tokens {k} exceeds the server's maximum of {max_k}")
    problems += limits.text_problems(request.request_id, "request_id", limits.MAX_REQUEST_ID_LENGTH)
    problems += limits.text_problems(request.tenant, "tenant", limits.MAX_TENANT_LENGTH)
    if problems:
        raise InvalidRequest("; ".join(problems))
    return DecodeSpec(request.request_id, prompt, sampling, request.max_tokens, list(request.stop), k,
                      request.tenant)
