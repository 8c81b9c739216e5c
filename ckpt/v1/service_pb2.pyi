import datetime

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
WRITE_MODE_UNSPECIFIED: WriteMode
WRITE_MODE_REPLACE: WriteMode
WRITE_MODE_MERGE: WriteMode
FRAME_KIND_UNSPECIFIED: FrameKind
FRAME_KIND_FULL: FrameKind
FRAME_KIND_DELTA: FrameKind
FRAME_KIND_PATCH: FrameKind

class PutRequest(_message.Message):
    __slots__ = ("session_id", "state", "mode", "expected_version", "request_id", "labels", "message_type")
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
    session_id: str
    state: bytes
    mode: WriteMode
    expected_version: int
    request_id: str
    labels: _containers.ScalarMap[str, str]
    message_type: str
    def __init__(self, session_id: _Optional[str] = ..., state: _Optional[bytes] = ..., mode: _Optional[_Union[WriteMode, str]] = ..., expected_version: _Optional[int] = ..., request_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., message_type: _Optional[str] = ...) -> None: ...

class PutResponse(_message.Message):
    __slots__ = ("version", "stored_bytes", "frame_kind", "replayed", "state_size")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    FRAME_KIND_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    STATE_SIZE_FIELD_NUMBER: _ClassVar[int]
    version: int
    stored_bytes: int
    frame_kind: FrameKind
    replayed: bool
    state_size: int
    def __init__(self, version: _Optional[int] = ..., stored_bytes: _Optional[int] = ..., frame_kind: _Optional[_Union[FrameKind, str]] = ..., replayed: _Optional[bool] = ..., state_size: _Optional[int] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("session_id", "version")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    version: int
    def __init__(self, session_id: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("version", "state", "info", "message_type")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    version: int
    state: bytes
    info: VersionInfo
    message_type: str
    def __init__(self, version: _Optional[int] = ..., state: _Optional[bytes] = ..., info: _Optional[_Union[VersionInfo, _Mapping]] = ..., message_type: _Optional[str] = ...) -> None: ...

class VersionInfo(_message.Message):
    __slots__ = ("version", "parent_version", "created_at", "frame_kind", "stored_bytes", "state_size", "labels", "mode")
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
    version: int
    parent_version: int
    created_at: _timestamp_pb2.Timestamp
    frame_kind: FrameKind
    stored_bytes: int
    state_size: int
    labels: _containers.ScalarMap[str, str]
    mode: WriteMode
    def __init__(self, version: _Optional[int] = ..., parent_version: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., frame_kind: _Optional[_Union[FrameKind, str]] = ..., stored_bytes: _Optional[int] = ..., state_size: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., mode: _Optional[_Union[WriteMode, str]] = ...) -> None: ...

class ListVersionsRequest(_message.Message):
    __slots__ = ("session_id", "page_size", "page_token")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    page_size: int
    page_token: str
    def __init__(self, session_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListVersionsResponse(_message.Message):
    __slots__ = ("versions", "next_page_token")
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    versions: _containers.RepeatedCompositeFieldContainer[VersionInfo]
    next_page_token: str
    def __init__(self, versions: _Optional[_Iterable[_Union[VersionInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "label_filter", "updated_after", "updated_before")
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
    page_size: int
    page_token: str
    label_filter: _containers.ScalarMap[str, str]
    updated_after: _timestamp_pb2.Timestamp
    updated_before: _timestamp_pb2.Timestamp
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., label_filter: _Optional[_Mapping[str, str]] = ..., updated_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

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
    __slots__ = ("session_id", "version", "new_session_id", "labels")
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
    session_id: str
    version: int
    new_session_id: str
    labels: _containers.ScalarMap[str, str]
    def __init__(self, session_id: _Optional[str] = ..., version: _Optional[int] = ..., new_session_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

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
    __slots__ = ("deleted_versions",)
    DELETED_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    deleted_versions: int
    def __init__(self, deleted_versions: _Optional[int] = ...) -> None: ...

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
