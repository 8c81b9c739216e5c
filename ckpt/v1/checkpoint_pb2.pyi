import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATUS_UNSPECIFIED: _ClassVar[Status]
    STATUS_RUNNING: _ClassVar[Status]
    STATUS_WAITING_FOR_APPROVAL: _ClassVar[Status]
    STATUS_PAUSED: _ClassVar[Status]
    STATUS_DONE: _ClassVar[Status]
    STATUS_FAILED: _ClassVar[Status]

class StepStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STEP_STATUS_UNSPECIFIED: _ClassVar[StepStatus]
    STEP_STATUS_PENDING: _ClassVar[StepStatus]
    STEP_STATUS_IN_PROGRESS: _ClassVar[StepStatus]
    STEP_STATUS_DONE: _ClassVar[StepStatus]
    STEP_STATUS_FAILED: _ClassVar[StepStatus]
    STEP_STATUS_SKIPPED: _ClassVar[StepStatus]

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_SYSTEM: _ClassVar[Role]
    ROLE_USER: _ClassVar[Role]
    ROLE_ASSISTANT: _ClassVar[Role]
    ROLE_TOOL: _ClassVar[Role]
STATUS_UNSPECIFIED: Status
STATUS_RUNNING: Status
STATUS_WAITING_FOR_APPROVAL: Status
STATUS_PAUSED: Status
STATUS_DONE: Status
STATUS_FAILED: Status
STEP_STATUS_UNSPECIFIED: StepStatus
STEP_STATUS_PENDING: StepStatus
STEP_STATUS_IN_PROGRESS: StepStatus
STEP_STATUS_DONE: StepStatus
STEP_STATUS_FAILED: StepStatus
STEP_STATUS_SKIPPED: StepStatus
ROLE_UNSPECIFIED: Role
ROLE_SYSTEM: Role
ROLE_USER: Role
ROLE_ASSISTANT: Role
ROLE_TOOL: Role

class Checkpoint(_message.Message):
    __slots__ = ("schema_version", "step", "status", "current_step_id", "goal", "model", "handoff", "conversation_summary", "plan", "working_memory", "step_results", "decisions", "discoveries", "tool_cache", "artifacts", "messages")
    class PlanEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: PlanStep
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[PlanStep, _Mapping]] = ...) -> None: ...
    class WorkingMemoryEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class ToolCacheEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ToolResult
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ToolResult, _Mapping]] = ...) -> None: ...
    class ArtifactsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ArtifactRef
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ArtifactRef, _Mapping]] = ...) -> None: ...
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_STEP_ID_FIELD_NUMBER: _ClassVar[int]
    GOAL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    HANDOFF_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_SUMMARY_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    WORKING_MEMORY_FIELD_NUMBER: _ClassVar[int]
    STEP_RESULTS_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    DISCOVERIES_FIELD_NUMBER: _ClassVar[int]
    TOOL_CACHE_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    step: int
    status: Status
    current_step_id: str
    goal: str
    model: ModelParams
    handoff: Handoff
    conversation_summary: str
    plan: _containers.MessageMap[str, PlanStep]
    working_memory: _containers.ScalarMap[str, str]
    step_results: _containers.RepeatedCompositeFieldContainer[StepResult]
    decisions: _containers.RepeatedCompositeFieldContainer[Decision]
    discoveries: _containers.RepeatedCompositeFieldContainer[Discovery]
    tool_cache: _containers.MessageMap[str, ToolResult]
    artifacts: _containers.MessageMap[str, ArtifactRef]
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    def __init__(self, schema_version: _Optional[int] = ..., step: _Optional[int] = ..., status: _Optional[_Union[Status, str]] = ..., current_step_id: _Optional[str] = ..., goal: _Optional[str] = ..., model: _Optional[_Union[ModelParams, _Mapping]] = ..., handoff: _Optional[_Union[Handoff, _Mapping]] = ..., conversation_summary: _Optional[str] = ..., plan: _Optional[_Mapping[str, PlanStep]] = ..., working_memory: _Optional[_Mapping[str, str]] = ..., step_results: _Optional[_Iterable[_Union[StepResult, _Mapping]]] = ..., decisions: _Optional[_Iterable[_Union[Decision, _Mapping]]] = ..., discoveries: _Optional[_Iterable[_Union[Discovery, _Mapping]]] = ..., tool_cache: _Optional[_Mapping[str, ToolResult]] = ..., artifacts: _Optional[_Mapping[str, ArtifactRef]] = ..., messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ...) -> None: ...

class PlanStep(_message.Message):
    __slots__ = ("id", "title", "status", "depends_on", "order", "notes")
    ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DEPENDS_ON_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    id: str
    title: str
    status: StepStatus
    depends_on: _containers.RepeatedScalarFieldContainer[str]
    order: int
    notes: str
    def __init__(self, id: _Optional[str] = ..., title: _Optional[str] = ..., status: _Optional[_Union[StepStatus, str]] = ..., depends_on: _Optional[_Iterable[str]] = ..., order: _Optional[int] = ..., notes: _Optional[str] = ...) -> None: ...

class StepResult(_message.Message):
    __slots__ = ("step_id", "ok", "output", "error", "started_at", "finished_at", "artifact_ids")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_IDS_FIELD_NUMBER: _ClassVar[int]
    step_id: str
    ok: bool
    output: str
    error: str
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    artifact_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, step_id: _Optional[str] = ..., ok: _Optional[bool] = ..., output: _Optional[str] = ..., error: _Optional[str] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., artifact_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("id", "step_id", "choice", "reasoning", "alternatives", "decided_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    ALTERNATIVES_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    step_id: str
    choice: str
    reasoning: str
    alternatives: _containers.RepeatedScalarFieldContainer[str]
    decided_at: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., step_id: _Optional[str] = ..., choice: _Optional[str] = ..., reasoning: _Optional[str] = ..., alternatives: _Optional[_Iterable[str]] = ..., decided_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Discovery(_message.Message):
    __slots__ = ("fact", "source", "observed_at", "confidence")
    FACT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_AT_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    fact: str
    source: str
    observed_at: _timestamp_pb2.Timestamp
    confidence: float
    def __init__(self, fact: _Optional[str] = ..., source: _Optional[str] = ..., observed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., confidence: _Optional[float] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("role", "content", "name", "tool_calls", "tool_call_id", "created_at")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    role: Role
    content: str
    name: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    tool_call_id: str
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., content: _Optional[str] = ..., name: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., tool_call_id: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "arguments_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments_json: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...

class ToolResult(_message.Message):
    __slots__ = ("tool", "canonical_args_json", "result", "is_error", "created_at", "artifact_id")
    TOOL_FIELD_NUMBER: _ClassVar[int]
    CANONICAL_ARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    tool: str
    canonical_args_json: str
    result: bytes
    is_error: bool
    created_at: _timestamp_pb2.Timestamp
    artifact_id: str
    def __init__(self, tool: _Optional[str] = ..., canonical_args_json: _Optional[str] = ..., result: _Optional[bytes] = ..., is_error: _Optional[bool] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., artifact_id: _Optional[str] = ...) -> None: ...

class ArtifactRef(_message.Message):
    __slots__ = ("uri", "content_hash", "size_bytes", "media_type", "digest", "created_at")
    URI_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEDIA_TYPE_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    uri: str
    content_hash: str
    size_bytes: int
    media_type: str
    digest: str
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, uri: _Optional[str] = ..., content_hash: _Optional[str] = ..., size_bytes: _Optional[int] = ..., media_type: _Optional[str] = ..., digest: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ModelParams(_message.Message):
    __slots__ = ("model_id", "temperature", "top_p", "seed", "max_output_tokens")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    temperature: float
    top_p: float
    seed: int
    max_output_tokens: int
    def __init__(self, model_id: _Optional[str] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., max_output_tokens: _Optional[int] = ...) -> None: ...

class Handoff(_message.Message):
    __slots__ = ("in_progress", "decided", "next", "can_wait", "waiting_on")
    IN_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    DECIDED_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    CAN_WAIT_FIELD_NUMBER: _ClassVar[int]
    WAITING_ON_FIELD_NUMBER: _ClassVar[int]
    in_progress: str
    decided: str
    next: str
    can_wait: str
    waiting_on: str
    def __init__(self, in_progress: _Optional[str] = ..., decided: _Optional[str] = ..., next: _Optional[str] = ..., can_wait: _Optional[str] = ..., waiting_on: _Optional[str] = ...) -> None: ...
