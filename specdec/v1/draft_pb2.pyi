from specdec.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProposeRequest(_message.Message):
    __slots__ = ("start", "next")
    START_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    start: StartSequence
    next: NextBlock
    def __init__(self, start: _Optional[_Union[StartSequence, _Mapping]] = ..., next: _Optional[_Union[NextBlock, _Mapping]] = ...) -> None: ...

class StartSequence(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "sampling", "return_probs", "tenant", "max_context", "pipeline", "constraint", "output_start")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    RETURN_PROBS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_START_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _common_pb2.SamplingParams
    return_probs: bool
    tenant: str
    max_context: int
    pipeline: bool
    constraint: _common_pb2.Constraint
    output_start: int
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., return_probs: _Optional[bool] = ..., tenant: _Optional[str] = ..., max_context: _Optional[int] = ..., pipeline: _Optional[bool] = ..., constraint: _Optional[_Union[_common_pb2.Constraint, _Mapping]] = ..., output_start: _Optional[int] = ...) -> None: ...

class NextBlock(_message.Message):
    __slots__ = ("keep_length", "append_token_ids", "num_tokens", "round", "sized_only", "min_sized")
    KEEP_LENGTH_FIELD_NUMBER: _ClassVar[int]
    APPEND_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SIZED_ONLY_FIELD_NUMBER: _ClassVar[int]
    MIN_SIZED_FIELD_NUMBER: _ClassVar[int]
    keep_length: int
    append_token_ids: _containers.RepeatedScalarFieldContainer[int]
    num_tokens: int
    round: int
    sized_only: bool
    min_sized: int
    def __init__(self, keep_length: _Optional[int] = ..., append_token_ids: _Optional[_Iterable[int]] = ..., num_tokens: _Optional[int] = ..., round: _Optional[int] = ..., sized_only: _Optional[bool] = ..., min_sized: _Optional[int] = ...) -> None: ...

class ProposeResponse(_message.Message):
    __slots__ = ("token_ids", "probs", "sequence_length", "round", "ahead", "answered_ahead", "num_chained", "num_forced", "sized_by_draft")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROBS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    AHEAD_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_AHEAD_FIELD_NUMBER: _ClassVar[int]
    NUM_CHAINED_FIELD_NUMBER: _ClassVar[int]
    NUM_FORCED_FIELD_NUMBER: _ClassVar[int]
    SIZED_BY_DRAFT_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    probs: bytes
    sequence_length: int
    round: int
    ahead: AheadAssumption
    answered_ahead: bool
    num_chained: int
    num_forced: int
    sized_by_draft: bool
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., probs: _Optional[bytes] = ..., sequence_length: _Optional[int] = ..., round: _Optional[int] = ..., ahead: _Optional[_Union[AheadAssumption, _Mapping]] = ..., answered_ahead: _Optional[bool] = ..., num_chained: _Optional[int] = ..., num_forced: _Optional[int] = ..., sized_by_draft: _Optional[bool] = ...) -> None: ...

class AheadAssumption(_message.Message):
    __slots__ = ("keep_length", "append_token_ids")
    KEEP_LENGTH_FIELD_NUMBER: _ClassVar[int]
    APPEND_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    keep_length: int
    append_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, keep_length: _Optional[int] = ..., append_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GetDraftInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetDraftInfoResponse(_message.Message):
    __slots__ = ("info", "method", "max_speculative_tokens", "sizes_blocks", "sizes_some_blocks")
    INFO_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    MAX_SPECULATIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SIZES_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SIZES_SOME_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    info: _common_pb2.ModelInfo
    method: str
    max_speculative_tokens: int
    sizes_blocks: bool
    sizes_some_blocks: bool
    def __init__(self, info: _Optional[_Union[_common_pb2.ModelInfo, _Mapping]] = ..., method: _Optional[str] = ..., max_speculative_tokens: _Optional[int] = ..., sizes_blocks: _Optional[bool] = ..., sizes_some_blocks: _Optional[bool] = ...) -> None: ...
