import datetime

from google.protobuf import field_mask_pb2 as _field_mask_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WriteMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WRITE_MODE_UNSPECIFIED: _ClassVar[WriteMode]
    WRITE_MODE_REPLACE: _ClassVar[WriteMode]
    WRITE_MODE_MERGE: _ClassVar[WriteMode]

class FrameKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FRAME_KIND_UNSPECIFIED: _ClassVar[FrameKind]
    FRAME_KIND_FULL: _ClassVar[FrameKind]
    FRAME_KIND_DELTA: _ClassVar[FrameKind]
    FRAME_KIND_PATCH: _ClassVar[FrameKind]
    FRAME_KIND_PREFIX: _ClassVar[FrameKind]
WRITE_MODE_UNSPECIFIED: WriteMode
WRITE_MODE_REPLACE: WriteMode
WRITE_MODE_MERGE: WriteMode
FRAME_KIND_UNSPECIFIED: FrameKind
FRAME_KIND_FULL: FrameKind
FRAME_KIND_DELTA: FrameKind
FRAME_KIND_PATCH: FrameKind
FRAME_KIND_PREFIX: FrameKind

class PutRequest(_message.Message):
    __slots__ = ("session_id", "state", "mode", "expected_version", "request_id", "labels", "message_type", "expected_state_xxh3")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_STATE_XXH3_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    state: bytes
    mode: WriteMode
    expected_version: int
    request_id: str
    labels: _containers.ScalarMap[str, str]
    message_type: str
    expected_state_xxh3: int
    def __init__(self, session_id: _Optional[str] = ..., state: _Optional[bytes] = ..., mode: _Optional[_Union[WriteMode, str]] = ..., expected_version: _Optional[int] = ..., request_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., message_type: _Optional[str] = ..., expected_state_xxh3: _Optional[int] = ...) -> None: ...

class PutResponse(_message.Message):
    __slots__ = ("version", "stored_bytes", "frame_kind", "replayed", "state_size", "state_xxh3")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    FRAME_KIND_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    STATE_SIZE_FIELD_NUMBER: _ClassVar[int]
    STATE_XXH3_FIELD_NUMBER: _ClassVar[int]
    version: int
    stored_bytes: int
    frame_kind: FrameKind
    replayed: bool
    state_size: int
    state_xxh3: int
    def __init__(self, version: _Optional[int] = ..., stored_bytes: _Optional[int] = ..., frame_kind: _Optional[_Union[FrameKind, str]] = ..., replayed: _Optional[bool] = ..., state_size: _Optional[int] = ..., state_xxh3: _Optional[int] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("session_id", "version", "field_mask", "events", "known_state_xxh3")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FIELD_MASK_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    KNOWN_STATE_XXH3_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    version: int
    field_mask: _field_mask_pb2.FieldMask
    events: ReadEventsRequest
    known_state_xxh3: int
    def __init__(self, session_id: _Optional[str] = ..., version: _Optional[int] = ..., field_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ..., events: _Optional[_Union[ReadEventsRequest, _Mapping]] = ..., known_state_xxh3: _Optional[int] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("version", "state", "info", "message_type", "events", "state_omitted")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    STATE_OMITTED_FIELD_NUMBER: _ClassVar[int]
    version: int
    state: bytes
    info: VersionInfo
    message_type: str
    events: ReadEventsResponse
    state_omitted: bool
    def __init__(self, version: _Optional[int] = ..., state: _Optional[bytes] = ..., info: _Optional[_Union[VersionInfo, _Mapping]] = ..., message_type: _Optional[str] = ..., events: _Optional[_Union[ReadEventsResponse, _Mapping]] = ..., state_omitted: _Optional[bool] = ...) -> None: ...

class VersionInfo(_message.Message):
    __slots__ = ("version", "parent_version", "created_at", "frame_kind", "stored_bytes", "state_size", "labels", "mode", "state", "state_xxh3", "state_suffix")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PARENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    FRAME_KIND_FIELD_NUMBER: _ClassVar[int]
    STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    STATE_SIZE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STATE_XXH3_FIELD_NUMBER: _ClassVar[int]
    STATE_SUFFIX_FIELD_NUMBER: _ClassVar[int]
    version: int
    parent_version: int
    created_at: _timestamp_pb2.Timestamp
    frame_kind: FrameKind
    stored_bytes: int
    state_size: int
    labels: _containers.ScalarMap[str, str]
    mode: WriteMode
    state: bytes
    state_xxh3: int
    state_suffix: bytes
    def __init__(self, version: _Optional[int] = ..., parent_version: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., frame_kind: _Optional[_Union[FrameKind, str]] = ..., stored_bytes: _Optional[int] = ..., state_size: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., mode: _Optional[_Union[WriteMode, str]] = ..., state: _Optional[bytes] = ..., state_xxh3: _Optional[int] = ..., state_suffix: _Optional[bytes] = ...) -> None: ...

class ListVersionsRequest(_message.Message):
    __slots__ = ("session_id", "page_size", "page_token", "include_states", "start_version", "states_as_suffixes")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_STATES_FIELD_NUMBER: _ClassVar[int]
    START_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATES_AS_SUFFIXES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    page_size: int
    page_token: str
    include_states: bool
    start_version: int
    states_as_suffixes: bool
    def __init__(self, session_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., include_states: _Optional[bool] = ..., start_version: _Optional[int] = ..., states_as_suffixes: _Optional[bool] = ...) -> None: ...

class ListVersionsResponse(_message.Message):
    __slots__ = ("versions", "next_page_token")
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    versions: _containers.RepeatedCompositeFieldContainer[VersionInfo]
    next_page_token: str
    def __init__(self, versions: _Optional[_Iterable[_Union[VersionInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "label_filter", "updated_after", "updated_before", "session_id_prefix")
    class LabelFilterEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LABEL_FILTER_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AFTER_FIELD_NUMBER: _ClassVar[int]
    UPDATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_PREFIX_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    label_filter: _containers.ScalarMap[str, str]
    updated_after: _timestamp_pb2.Timestamp
    updated_before: _timestamp_pb2.Timestamp
    session_id_prefix: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., label_filter: _Optional[_Mapping[str, str]] = ..., updated_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., session_id_prefix: _Optional[str] = ...) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("sessions", "next_page_token")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[SessionInfo]
    next_page_token: str
    def __init__(self, sessions: _Optional[_Iterable[_Union[SessionInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class SessionInfo(_message.Message):
    __slots__ = ("session_id", "head_version", "created_at", "updated_at", "labels", "stored_bytes", "version_count", "forked_from_session_id", "forked_from_version", "message_type")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    HEAD_VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    VERSION_COUNT_FIELD_NUMBER: _ClassVar[int]
    FORKED_FROM_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FORKED_FROM_VERSION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    head_version: int
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    labels: _containers.ScalarMap[str, str]
    stored_bytes: int
    version_count: int
    forked_from_session_id: str
    forked_from_version: int
    message_type: str
    def __init__(self, session_id: _Optional[str] = ..., head_version: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., stored_bytes: _Optional[int] = ..., version_count: _Optional[int] = ..., forked_from_session_id: _Optional[str] = ..., forked_from_version: _Optional[int] = ..., message_type: _Optional[str] = ...) -> None: ...

class ForkRequest(_message.Message):
    __slots__ = ("session_id", "version", "new_session_id", "labels", "copy_events")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NEW_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    COPY_EVENTS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    version: int
    new_session_id: str
    labels: _containers.ScalarMap[str, str]
    copy_events: bool
    def __init__(self, session_id: _Optional[str] = ..., version: _Optional[int] = ..., new_session_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., copy_events: _Optional[bool] = ...) -> None: ...

class ForkResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: SessionInfo
    def __init__(self, session: _Optional[_Union[SessionInfo, _Mapping]] = ...) -> None: ...

class DeleteSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class DeleteSessionResponse(_message.Message):
    __slots__ = ("deleted_versions", "deleted_events")
    DELETED_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    DELETED_EVENTS_FIELD_NUMBER: _ClassVar[int]
    deleted_versions: int
    deleted_events: int
    def __init__(self, deleted_versions: _Optional[int] = ..., deleted_events: _Optional[int] = ...) -> None: ...

class PutStreamRequest(_message.Message):
    __slots__ = ("puts", "batch_id")
    PUTS_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    puts: _containers.RepeatedCompositeFieldContainer[PutRequest]
    batch_id: int
    def __init__(self, puts: _Optional[_Iterable[_Union[PutRequest, _Mapping]]] = ..., batch_id: _Optional[int] = ...) -> None: ...

class PutStreamResponse(_message.Message):
    __slots__ = ("results", "batch_id")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[PutResult]
    batch_id: int
    def __init__(self, results: _Optional[_Iterable[_Union[PutResult, _Mapping]]] = ..., batch_id: _Optional[int] = ...) -> None: ...

class PutResult(_message.Message):
    __slots__ = ("response", "error")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    response: PutResponse
    error: PutError
    def __init__(self, response: _Optional[_Union[PutResponse, _Mapping]] = ..., error: _Optional[_Union[PutError, _Mapping]] = ...) -> None: ...

class PutError(_message.Message):
    __slots__ = ("code", "message", "current_version")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CURRENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    current_version: int
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., current_version: _Optional[int] = ...) -> None: ...

class RegisterTypeRequest(_message.Message):
    __slots__ = ("file_descriptor_set",)
    FILE_DESCRIPTOR_SET_FIELD_NUMBER: _ClassVar[int]
    file_descriptor_set: bytes
    def __init__(self, file_descriptor_set: _Optional[bytes] = ...) -> None: ...

class RegisterTypeResponse(_message.Message):
    __slots__ = ("message_types",)
    MESSAGE_TYPES_FIELD_NUMBER: _ClassVar[int]
    message_types: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, message_types: _Optional[_Iterable[str]] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("type", "payload", "attributes", "time", "seq")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    type: str
    payload: bytes
    attributes: _containers.ScalarMap[str, str]
    time: _timestamp_pb2.Timestamp
    seq: int
    def __init__(self, type: _Optional[str] = ..., payload: _Optional[bytes] = ..., attributes: _Optional[_Mapping[str, str]] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., seq: _Optional[int] = ...) -> None: ...

class AppendEventsRequest(_message.Message):
    __slots__ = ("session_id", "events", "request_id", "put", "expected_last_seq")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PUT_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    events: _containers.RepeatedCompositeFieldContainer[Event]
    request_id: str
    put: PutRequest
    expected_last_seq: int
    def __init__(self, session_id: _Optional[str] = ..., events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., request_id: _Optional[str] = ..., put: _Optional[_Union[PutRequest, _Mapping]] = ..., expected_last_seq: _Optional[int] = ...) -> None: ...

class AppendEventsResponse(_message.Message):
    __slots__ = ("first_seq", "last_seq", "put", "replayed", "log_last_seq")
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    PUT_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    LOG_LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    first_seq: int
    last_seq: int
    put: PutResponse
    replayed: bool
    log_last_seq: int
    def __init__(self, first_seq: _Optional[int] = ..., last_seq: _Optional[int] = ..., put: _Optional[_Union[PutResponse, _Mapping]] = ..., replayed: _Optional[bool] = ..., log_last_seq: _Optional[int] = ...) -> None: ...

class ReadEventsRequest(_message.Message):
    __slots__ = ("session_id", "after_seq", "types", "after", "before", "newest_first", "page_size", "page_token")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    TYPES_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    NEWEST_FIRST_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    after_seq: int
    types: _containers.RepeatedScalarFieldContainer[str]
    after: _timestamp_pb2.Timestamp
    before: _timestamp_pb2.Timestamp
    newest_first: bool
    page_size: int
    page_token: str
    def __init__(self, session_id: _Optional[str] = ..., after_seq: _Optional[int] = ..., types: _Optional[_Iterable[str]] = ..., after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., newest_first: _Optional[bool] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ReadEventsResponse(_message.Message):
    __slots__ = ("events", "next_page_token", "log_created_at")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOG_CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    next_page_token: str
    log_created_at: _timestamp_pb2.Timestamp
    def __init__(self, events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., log_created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class PutBlobRequest(_message.Message):
    __slots__ = ("session_id", "media_type", "expected_sha256", "chunk", "end")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MEDIA_TYPE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SHA256_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    media_type: str
    expected_sha256: str
    chunk: bytes
    end: bool
    def __init__(self, session_id: _Optional[str] = ..., media_type: _Optional[str] = ..., expected_sha256: _Optional[str] = ..., chunk: _Optional[bytes] = ..., end: _Optional[bool] = ...) -> None: ...

class PutBlobResponse(_message.Message):
    __slots__ = ("sha256", "size_bytes", "uri")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    size_bytes: int
    uri: str
    def __init__(self, sha256: _Optional[str] = ..., size_bytes: _Optional[int] = ..., uri: _Optional[str] = ...) -> None: ...

class GetBlobRequest(_message.Message):
    __slots__ = ("sha256", "offset", "length")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    offset: int
    length: int
    def __init__(self, sha256: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class GetBlobResponse(_message.Message):
    __slots__ = ("chunk", "size_bytes", "media_type")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEDIA_TYPE_FIELD_NUMBER: _ClassVar[int]
    chunk: bytes
    size_bytes: int
    media_type: str
    def __init__(self, chunk: _Optional[bytes] = ..., size_bytes: _Optional[int] = ..., media_type: _Optional[str] = ...) -> None: ...
