from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "seed")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    seed: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ...) -> None: ...

class SpeculationStats(_message.Message):
    __slots__ = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "acceptance_rate", "mean_accepted_length", "accepted_per_position", "num_rounds", "num_fallback_rounds", "num_ahead_used", "num_ahead_discarded", "num_stepped_rounds", "num_prefetched_used", "num_forced_tokens")
    NUM_DRAFTS_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_RATE_FIELD_NUMBER: _ClassVar[int]
    MEAN_ACCEPTED_LENGTH_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_PER_POSITION_FIELD_NUMBER: _ClassVar[int]
    NUM_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    NUM_FALLBACK_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    NUM_AHEAD_USED_FIELD_NUMBER: _ClassVar[int]
    NUM_AHEAD_DISCARDED_FIELD_NUMBER: _ClassVar[int]
    NUM_STEPPED_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    NUM_PREFETCHED_USED_FIELD_NUMBER: _ClassVar[int]
    NUM_FORCED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    acceptance_rate: float
    mean_accepted_length: float
    accepted_per_position: _containers.RepeatedScalarFieldContainer[int]
    num_rounds: int
    num_fallback_rounds: int
    num_ahead_used: int
    num_ahead_discarded: int
    num_stepped_rounds: int
    num_prefetched_used: int
    num_forced_tokens: int
    def __init__(self, num_drafts: _Optional[int] = ..., num_draft_tokens: _Optional[int] = ..., num_accepted_tokens: _Optional[int] = ..., acceptance_rate: _Optional[float] = ..., mean_accepted_length: _Optional[float] = ..., accepted_per_position: _Optional[_Iterable[int]] = ..., num_rounds: _Optional[int] = ..., num_fallback_rounds: _Optional[int] = ..., num_ahead_used: _Optional[int] = ..., num_ahead_discarded: _Optional[int] = ..., num_stepped_rounds: _Optional[int] = ..., num_prefetched_used: _Optional[int] = ..., num_forced_tokens: _Optional[int] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("model", "vocab_size", "max_context", "eos_token_ids", "tokenizer_fingerprint", "tokenizer_class", "tokenizer_vocab_size", "num_parameters", "model_fingerprint")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_CLASS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    model: str
    vocab_size: int
    max_context: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    tokenizer_fingerprint: str
    tokenizer_class: str
    tokenizer_vocab_size: int
    num_parameters: int
    model_fingerprint: str
    def __init__(self, model: _Optional[str] = ..., vocab_size: _Optional[int] = ..., max_context: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., tokenizer_fingerprint: _Optional[str] = ..., tokenizer_class: _Optional[str] = ..., tokenizer_vocab_size: _Optional[int] = ..., num_parameters: _Optional[int] = ..., model_fingerprint: _Optional[str] = ...) -> None: ...

class Constraint(_message.Message):
    __slots__ = ("json_schema", "json_object", "regex", "choice", "grammar", "strict")
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    json_schema: str
    json_object: bool
    regex: str
    choice: Choices
    grammar: str
    strict: bool
    def __init__(self, json_schema: _Optional[str] = ..., json_object: _Optional[bool] = ..., regex: _Optional[str] = ..., choice: _Optional[_Union[Choices, _Mapping]] = ..., grammar: _Optional[str] = ..., strict: _Optional[bool] = ...) -> None: ...

class Choices(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, values: _Optional[_Iterable[str]] = ...) -> None: ...
