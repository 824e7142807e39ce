"""OpenAI's request and response shapes, mapped onto the Gateway contract (gateway.proto).

Pure functions and pydantic models, no I/O: a request body becomes a
GenerateRequest (the same contract the gRPC door serves), and the generation's
pieces become OpenAI's JSON, chat or text completion, whole or as stream chunks.

Extra body fields follow vLLM: `top_k`, `return_token_ids`, and
`num_speculative_tokens` (the draft block length k, 0 turns speculation off).
Per-request speculation statistics go in `metrics.speculative_decoding`, with
vLLM's names (vllm/entrypoints/generate/base/protocol.py SpeculativeDecodingMetrics).

A field this server does not implement is refused with a 400 that names it,
unless it carries the value that means "off" (n=1, logprobs=false, ...).
Types are strict, as OpenAI's are: "5" is not an integer and true is not 1, but
an integer is a number. Every string must be Unicode text (no lone surrogate,
which JSON can spell but UTF-8 cannot), and every number must fit the
Gateway contract's field, so a bad value is a 400 here and never a failure later.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
import typing
import uuid

import grpc
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from specdec.v1 import common_pb2, gateway_pb2

UINT32_MAX = 2**32 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
# Seconds a client should wait before retrying a 429 or 503: a slot frees as soon as any one request in flight
# ends, so the wait is short and fixed (the openai client waits exactly this long, rather than its own backoff).
RETRY_AFTER_S = 1
# JSON can spell half a UTF-16 pair ("\ud800"); Python keeps it, but it is not text and UTF-8 cannot encode it.
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# OpenAI's documented default for /v1/completions; chat leaves it to the server (--default-max-tokens).
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
# Fields accepted only with a value that asks for nothing this server lacks; null always passes.
NEUTRAL_VALUES: dict[str, tuple] = {
    "n": (1,), "best_of": (1,), "echo": (False,), "logprobs": (False,), "top_logprobs": (0,),
    "presence_penalty": (0,), "frequency_penalty": (0,), "repetition_penalty": (1,), "min_p": (0,),
    "logit_bias": ({},), "tools": ([],), "tool_choice": ("none",), "parallel_tool_calls": (False,),
    "suffix": ("",), "min_tokens": (0,), "ignore_eos": (False,),
    "stop_token_ids": ([],), "include_stop_str_in_output": (False,), "skip_special_tokens": (True,),
    "store": (False,),
}
# Metadata that changes nothing about the output.
IGNORED_FIELDS = {"user"}


class OpenAIError(Exception):
    """An error in OpenAI's error object; `param` names the request field when one is at fault."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        # A client's string quoted back (a field name, a value) may hold a lone surrogate: escape it, so the
        # error itself can be written as UTF-8 JSON.
        self.status, self.message, self.param, self.code = status, _printable(message), _printable(param), code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": error_type(self.status), "param": self.param,
                          "code": self.code}}

    def headers(self) -> dict[str, str]:
        """Retry-After (seconds) on the statuses a client should retry: capacity (429) and availability (503)."""
        return {"Retry-After": str(RETRY_AFTER_S)} if self.status in (429, 503) else {}


ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}


def error_type(status: int) -> str:
    """OpenAI's error type: the client's fault (4xx) is an invalid request unless it is one of the named kinds."""
    return ERROR_TYPES.get(status, "invalid_request_error" if 400 <= status < 500 else "server_error")


def _printable(text: str | None) -> str | None:
    return text if text is None or not LONE_SURROGATE.search(text) else \
        text.encode("utf-8", "backslashreplace").decode("utf-8")


# gRPC status from the generation core -> (HTTP status, OpenAI error code)
HTTP_OF_GRPC = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, None),
    grpc.StatusCode.FAILED_PRECONDITION: (400, None),
    grpc.StatusCode.UNAUTHENTICATED: (401, "invalid_api_key"),
    grpc.StatusCode.NOT_FOUND: (404, None),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "capacity_exceeded"),
    grpc.StatusCode.CANCELLED: (499, "cancelled"),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout"),
}
# Request fields that validation messages start with, as the OpenAI request names them.
PARAM_OF_FIELD = {"prompt": "prompt", "prompt_token_ids": "prompt", "max_tokens": "max_tokens",
                  "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "seed": "seed", "stop": "stop",
                  "num_speculative_tokens": "num_speculative_tokens",
                  **{f"constraint.{kind}": "response_format"
                     for kind in ("json_schema", "json_object", "regex", "choice", "grammar")}}


def error_from_grpc(code: grpc.StatusCode, message: str, chat: bool) -> OpenAIError:
    status, error_code = HTTP_OF_GRPC.get(code, (500, None))
    param = None
    if status == 400:
        param = PARAM_OF_FIELD.get(message.split(" ", 1)[0])
        if chat and param == "prompt":
            param = "messages"
    return OpenAIError(status, message, param, error_code)


# ---------------------------------------------------------------- requests

def _unicode_text(text: str) -> str:
    found = LONE_SURROGATE.search(text)
    if found:
        raise ValueError(f"holds a lone UTF-16 surrogate (U+{ord(found.group()):04X}) at character {found.start()}, "
                         "which is not Unicode text; send the whole surrogate pair or the character itself")
    return text


Text = typing.Annotated[str, AfterValidator(_unicode_text)]
Int32 = typing.Annotated[int, Field(ge=INT32_MIN, le=INT32_MAX)]  # a TokenIds id, top_k: int32 in the contract


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class TextPart(_Strict):
    type: typing.Literal["text"]
    text: Text


class ChatMessage(_Strict):
    role: typing.Literal["system", "developer", "user", "assistant"]
    content: Text | list[TextPart]
    name: Text | None = None  # the participant's name: given to the chat template, which may show or ignore it

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class JsonSchemaFormat(_Strict):
    """OpenAI's response_format.json_schema."""

    name: Text
    description: Text | None = None
    schema_: dict | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    """OpenAI's response_format: text (no constraint), any JSON object, or JSON by a schema."""

    type: typing.Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(_Strict):
    """vLLM's extra body field structured_outputs: exactly one of these."""

    json_: dict | Text | None = Field(None, alias="json")  # `json` would shadow BaseModel.json
    json_object: bool | None = None
    regex: Text | None = None
    choice: list[Text] | None = None
    grammar: Text | None = None


class _Sampling(BaseModel):
    """What both endpoints take. Unknown fields land in model_extra and are checked by unsupported()."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: Text | None = None
    max_tokens: int | None = Field(None, ge=1, le=UINT32_MAX)
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = Field(None, ge=0, le=2**64 - 1)
    stop: Text | list[Text] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # vLLM's extra body fields
    top_k: Int32 | None = None
    num_speculative_tokens: int | None = Field(None, ge=0, le=UINT32_MAX)
    return_token_ids: bool = False
    # structured outputs: OpenAI's field, and vLLM's extra body field
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None

    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=UINT32_MAX)


class CompletionRequest(_Sampling):
    prompt: Text | list[Text] | list[Int32] | list[list[Int32]]


REQUEST_MODELS = (ChatCompletionRequest, CompletionRequest, ChatMessage, TextPart, StreamOptions, ResponseFormat,
                  JsonSchemaFormat, StructuredOutputs)
FIELD_NAMES = frozenset(field.alias or name for model in REQUEST_MODELS for name, field in model.model_fields.items())


def error_from_validation(errors: list[dict]) -> OpenAIError:
    """One 400 for pydantic's errors about a body: the most specific one, its `param` the field's dotted path.

    A field that takes several types (prompt: text or ids) gets one error per type; the error that got
    furthest into the value wins, a wrong value over a wrong type, and wrong types at one place are told together.
    """
    if not errors:
        return OpenAIError(400, "the request body is invalid")
    first = errors[0]
    if first["type"] == "json_invalid":
        where = f" (at character {first['loc'][-1]})" if len(first["loc"]) > 1 else ""  # FastAPI's: ("body", pos)
        reason = (first.get("ctx") or {}).get("error", first["msg"])
        return OpenAIError(400, f"the request body is not valid JSON: {reason}{where}", code="invalid_json")
    ranked = [(len(path), error["type"] not in TYPE_ERRORS, path, error)
              for error in errors for path in [field_path(error)]]
    _depth, wrong_value, path, best = max(ranked, key=lambda rank: rank[:2])
    param = ".".join(str(part) for part in path) or None
    if wrong_value:
        message = _message(best)
    else:  # only wrong types here: say every type the field takes
        said = dict.fromkeys(_message(error) for _, value, at, error in ranked if at == path and not value)
        message = " or ".join(m.removeprefix("Input should be ") if i else m for i, m in enumerate(said))
    return OpenAIError(400, f"{param or 'body'}: {message}", param)


TYPE_ERRORS = {"string_type", "list_type", "int_type", "float_type", "bool_type", "model_type", "dict_type",
               "model_attributes_type", "literal_error", "none_required", "is_instance_of"}


def field_path(error: dict) -> list[str | int]:
    """The field's path in the body, as OpenAI's `param` spells it: names and list indexes, without the
    type tags pydantic puts in for fields that take several types (`prompt.list[int].0` is `prompt.0`)."""
    loc = list(error["loc"][1:] if error["loc"] and error["loc"][0] == "body" else error["loc"])
    path = [part for part in loc if isinstance(part, int) or part in FIELD_NAMES]
    if error["type"] == "extra_forbidden" and loc and loc[-1] not in path[-1:]:
        path.append(loc[-1])
    if error["type"] == "string_unicode" and not loc and isinstance(error.get("input"), str):
        path.append(error["input"])  # a field's name that is not text (a lone surrogate): pydantic gives no loc
    return path


def _message(error: dict) -> str:
    if error["type"] == "value_error":
        return str((error.get("ctx") or {}).get("error", error["msg"]))
    return error["msg"]


def unsupported(body: _Sampling) -> OpenAIError | None:
    """The first field this server would have to ignore, as a 400 naming it; None when there is none."""
    for name, value in (body.model_extra or {}).items():
        if name in IGNORED_FIELDS or value is None:
            continue
        if name not in NEUTRAL_VALUES:
            return OpenAIError(400, f"{name} is not supported by this server", name, "unsupported_parameter")
        if not any(_same_value(value, neutral) for neutral in NEUTRAL_VALUES[name]):
            allowed = " or ".join(repr(v) for v in NEUTRAL_VALUES[name])
            return OpenAIError(400, f"{name}={value!r} is not supported by this server (only {allowed} or null)",
                               name, "unsupported_parameter")
    if body.stream_options is not None and not body.stream:
        return OpenAIError(400, "stream_options is only allowed with stream=true", "stream_options")
    return None


def _same_value(value, neutral) -> bool:
    """Equal, without letting true pass for 1 or 1.0 fail for 1."""
    if isinstance(value, bool) or isinstance(neutral, bool):
        return value is neutral
    return value == neutral


def max_tokens_of(body: _Sampling) -> int | None:
    """The max_tokens the client sent; None leaves it to default_max_tokens."""
    if isinstance(body, CompletionRequest):
        return body.max_tokens
    chat = typing.cast(ChatCompletionRequest, body)
    if chat.max_completion_tokens is not None and chat.max_tokens is not None \
            and chat.max_completion_tokens != chat.max_tokens:
        raise OpenAIError(400, f"max_tokens {chat.max_tokens} and max_completion_tokens {chat.max_completion_tokens} "
                               "disagree; send one of them", "max_tokens")
    return chat.max_completion_tokens if chat.max_completion_tokens is not None else chat.max_tokens


def default_max_tokens(body: _Sampling) -> int | None:
    """max_tokens for a body that leaves it unset (None: the server's --default-max-tokens). Either way the
    gateway holds it to the room the prompt leaves in the context, as vLLM does, rather than refuse a field the
    client never sent."""
    return COMPLETIONS_DEFAULT_MAX_TOKENS if isinstance(body, CompletionRequest) else None


def completion_prompt(body: CompletionRequest) -> str | list[int]:
    """The one prompt: text or token ids. A batch of several prompts is refused."""
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise OpenAIError(400, f"prompt holds {len(prompt)} prompts; send one prompt per request", "prompt")
        prompt = prompt[0]
    return prompt


def constraint_of(body: _Sampling) -> common_pb2.Constraint | None:
    """The Constraint that response_format or structured_outputs asks for (None: unconstrained). Only the
    shape is checked here; whether the schema, regex or grammar compiles is the verifier's answer (a 400)."""
    formats = body.response_format
    wanted = body.structured_outputs
    if formats is not None and formats.type == "text":
        formats = None
    if formats is not None and wanted is not None:
        raise OpenAIError(400, "response_format and structured_outputs both ask for a constraint; send one",
                          "structured_outputs")
    if formats is not None:
        if formats.type == "json_object":
            return common_pb2.Constraint(json_object=True)
        spec = formats.json_schema
        if spec is None or spec.schema_ is None:
            raise OpenAIError(400, "response_format.json_schema.schema is required with type json_schema",
                              "response_format")
        return common_pb2.Constraint(json_schema=json.dumps(spec.schema_), strict=bool(spec.strict))
    if wanted is None:
        return None
    names = {field.alias or name: name for name, field in StructuredOutputs.model_fields.items()}
    kinds = [alias for alias, name in names.items() if getattr(wanted, name) not in (None, False)]
    if len(kinds) != 1:
        raise OpenAIError(400, f"structured_outputs must set exactly one of {', '.join(names)}"
                               f" (it sets {', '.join(kinds) or 'none'})", "structured_outputs")
    kind = kinds[0]
    if kind == "json":
        schema = wanted.json_
        return common_pb2.Constraint(json_schema=schema if isinstance(schema, str) else json.dumps(schema))
    if kind == "json_object":
        return common_pb2.Constraint(json_object=True)
    if kind == "choice":
        return common_pb2.Constraint(choice=common_pb2.Choices(values=wanted.choice))
    return common_pb2.Constraint(**{kind: getattr(wanted, kind)})


def generate_request(body: _Sampling, prompt: str | list[int]) -> gateway_pb2.GenerateRequest:
    """The Gateway contract's request for this body: the same checks and defaults as the gRPC door from here on."""
    request = gateway_pb2.GenerateRequest(
        temperature=1.0 if body.temperature is None else body.temperature,  # OpenAI's default
        top_k=0 if body.top_k in (None, -1) else body.top_k,  # vLLM: -1 (or 0) keeps every token
        stop=[body.stop] if isinstance(body.stop, str) else list(body.stop or []),
        max_tokens=max_tokens_of(body) or 0)
    if isinstance(prompt, str):
        request.prompt = prompt
    else:
        request.prompt_token_ids.ids.extend(prompt)
    if body.top_p is not None:
        request.top_p = body.top_p
    if body.seed is not None:
        request.seed = body.seed
    if body.num_speculative_tokens is not None:
        request.num_speculative_tokens = body.num_speculative_tokens
    constraint = constraint_of(body)
    if constraint is not None:
        request.constraint.CopyFrom(constraint)
    return request


# ---------------------------------------------------------------- responses


def finish_reason(final) -> str:
    return "length" if final.finish_reason == common_pb2.FINISH_REASON_LENGTH else "stop"


def usage(final) -> dict:
    prompt, completion = final.usage.prompt_tokens, final.usage.completion_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def speculative_decoding(stats: common_pb2.SpeculationStats, requested_k: int | None) -> dict:
    """vLLM's per-request SpeculativeDecodingMetrics from our SpeculationStats, plus our own round counts.

    acceptance_histogram[j]: drafted rounds that accepted exactly j draft tokens (the bonus token excluded);
    derived from accepted_per_position, which counts rounds accepting at least i + 1.
    """
    per_position = list(stats.accepted_per_position)
    num_spec_tokens = max(len(per_position), requested_k or 0)
    at_least = [stats.num_drafts, *per_position] + [0] * (num_spec_tokens - len(per_position))
    histogram = [at_least[j] - (at_least[j + 1] if j + 1 < len(at_least) else 0) for j in range(num_spec_tokens + 1)]
    drafts, drafted, accepted = stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens
    return {
        "mean_acceptance_length": 1.0 + accepted / drafts if drafts else 1.0,
        "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
        "acceptance_histogram": histogram,
        "num_spec_steps": drafts,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafted,
        "num_spec_tokens": num_spec_tokens,
        # no vLLM counterpart
        "accepted_per_position": per_position,
        "num_rounds": stats.num_rounds,
        "num_fallback_rounds": stats.num_fallback_rounds,
    }


@dataclasses.dataclass
class Reply:
    """Builds one request's response objects, chat or text completion, whole or as stream chunks."""

    chat: bool
    model: str
    return_token_ids: bool = False
    include_usage: bool = False
    requested_k: int | None = None
    id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))

    def __post_init__(self):
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + self.id

    def _envelope(self, stream: bool, choices: list) -> dict:
        kind = ("chat.completion.chunk" if stream else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    def _metrics(self, final) -> dict:
        return {"speculative_decoding": speculative_decoding(final.speculation, self.requested_k)}

    def full(self, text: str, token_ids: list[int], final, prompt_ids: list[int]) -> dict:
        choice = {"index": 0, "logprobs": None, "finish_reason": finish_reason(final)}
        choice.update({"message": {"role": "assistant", "content": text}} if self.chat else {"text": text})
        if self.return_token_ids:
            choice["token_ids"] = list(token_ids)
        response = self._envelope(False, [choice])
        response.update(usage=usage(final), metrics=self._metrics(final))
        if self.return_token_ids:
            response["prompt_token_ids"] = list(prompt_ids)
        return response

    def chunk(self, text: str, token_ids: list[int], final=None, prompt_ids: list[int] | None = None) -> dict:
        """One stream chunk; the first (prompt_ids given) also carries the role, the last the finish_reason."""
        if self.chat:
            delta = {"role": "assistant", "content": text} if prompt_ids is not None else {"content": text}
            choice = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": text}
        choice.update(logprobs=None, finish_reason=finish_reason(final) if final is not None else None)
        if self.return_token_ids:
            choice["token_ids"] = list(token_ids)
        chunk = self._envelope(True, [choice])
        if self.return_token_ids and prompt_ids is not None:
            chunk["prompt_token_ids"] = list(prompt_ids)
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def usage_chunk(self, final) -> dict:
        """The last chunk when stream_options.include_usage: no choices, the usage and the statistics."""
        chunk = self._envelope(True, [])
        chunk.update(usage=usage(final), metrics=self._metrics(final))
        return chunk
