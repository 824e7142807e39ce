"""Check a GenerateRequest at the boundary; every problem names its field."""

from __future__ import annotations

import dataclasses

from specdec.runtime import limits
from specdec.decoding import sampling
from specdec.v1 import gateway_pb2, verifier_pb2


class InvalidRequest(ValueError):
    """Maps to INVALID_ARGUMENT; the message names the field."""


@dataclasses.dataclass(frozen=True)
class ModelLimits:
    """What one request can use: the model's context, the gateway's cap on prompts, and how much text a token
    can stand for, which bounds a prompt's characters and a request's bytes before anything is tokenized."""

    vocab_size: int
    max_context: int
    max_prompt_tokens: int = 0  # --max-prompt-tokens (0: the context)
    max_token_chars: int = 64  # the longest token's text, in characters and in UTF-8 bytes
    max_token_bytes: int = 256

    @property
    def prompt_tokens(self) -> int:
        """The longest prompt accepted, in tokens."""
        return min(self.max_context, self.max_prompt_tokens) if self.max_prompt_tokens else self.max_context

    @property
    def prompt_chars(self) -> int:
        """No prompt longer than this, in characters, can tokenize to prompt_tokens or fewer."""
        return min(limits.MAX_PROMPT_CHARS, self.prompt_tokens * self.max_token_chars)

    @property
    def request_bytes(self) -> int:
        """No request message larger than this can hold a prompt that fits."""
        per_token = max(self.max_token_bytes, limits.TOKEN_ID_BYTES)
        return min(self.prompt_chars * 4, self.prompt_tokens * per_token) + limits.REQUEST_OVERHEAD_BYTES

    def prompt_size_problem(self, request: gateway_pb2.GenerateRequest) -> str | None:
        """The cheap check, before tokenizing or copying ids: a prompt too long to fit, in words."""
        if request.WhichOneof("input") == "prompt_token_ids":
            count = len(request.prompt_token_ids.ids)
            if count > self.prompt_tokens:
                return f"prompt_token_ids has {count} ids; {self.prompt_limit_words()}"
        elif len(request.prompt) > self.prompt_chars:
            return (f"prompt has {len(request.prompt)} characters, more than any prompt of at most "
                    f"{self.prompt_tokens} tokens can have ({self.prompt_chars}); {self.prompt_limit_words()}")
        return None

    def messages_size_problem(self, contents: list[str]) -> str | None:
        """The cheap check before a chat template renders: more messages than a prompt that fits has tokens
        (each renders to at least one), or more characters than it can hold, in words."""
        if len(contents) > self.prompt_tokens:
            return f"messages has {len(contents)} messages; {self.prompt_limit_words()}"
        chars = sum(len(content) for content in contents)
        if chars > self.prompt_chars:
            return (f"messages have {chars} characters, more than any prompt of at most {self.prompt_tokens} "
                    f"tokens can have ({self.prompt_chars}); {self.prompt_limit_words()}")
        return None

    def prompt_limit_words(self) -> str:
        if self.prompt_tokens < self.max_context:
            return f"prompts may have at most {self.prompt_tokens} tokens (--max-prompt-tokens)"
        return f"the model's context is {self.max_context} tokens"


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
    room = limits_.max_context - len(prompt_ids or [])
    # Unset: the default, held to the room the prompt leaves (as vLLM does); only a value the client sent is refused.
    max_tokens = request.max_tokens or min(default_max_tokens, max(room, 1))
    if prompt_ids and len(prompt_ids) > limits_.prompt_tokens:
        problems.append(f"{field} has {len(prompt_ids)} tokens; {limits_.prompt_limit_words()}")
    elif prompt_ids and not request.max_tokens and room < 1:
        problems.append(f"{field} has {len(prompt_ids)} tokens, which fill the model's context of "
                        f"{limits_.max_context} tokens and leave no room for output")
    elif prompt_ids and len(prompt_ids) + max_tokens > limits_.max_context:
        problems.append(f"max_tokens {max_tokens} plus {len(prompt_ids)} prompt tokens exceeds the model's "
                        f"context of {limits_.max_context} tokens")
    problems += limits.stop_problems(list(request.stop), "stop")
    if request.HasField("constraint"):
        problems += limits.constraint_problems(request.constraint)
    if problems:
        raise InvalidRequest("; ".join(problems))
    decode = verifier_pb2.DecodeRequest(prompt_token_ids=prompt_ids, sampling=sampling.to_proto(params),
                                        max_tokens=max_tokens, stop=list(request.stop))
    if request.HasField("constraint"):
        decode.constraint.CopyFrom(request.constraint)  # sized here; compiled and checked by the verifier
    if request.HasField("num_speculative_tokens"):
        decode.num_speculative_tokens = request.num_speculative_tokens
    elif default_k >= 0:
        decode.num_speculative_tokens = default_k
    return decode
