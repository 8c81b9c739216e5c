import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SessionRecord(_message.Message):
    __slots__ = ("head_version", "chain_start_version", "first_version", "created_unix_nanos", "updated_unix_nanos", "stored_bytes", "version_count", "labels", "forked_from_session_id", "forked_from_version", "message_type", "blob_refs_unchecked", "open_keyframe_version")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    HEAD_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHAIN_START_VERSION_FIELD_NUMBER: _ClassVar[int]
    FIRST_VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    VERSION_COUNT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    FORKED_FROM_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FORKED_FROM_VERSION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    BLOB_REFS_UNCHECKED_FIELD_NUMBER: _ClassVar[int]
    OPEN_KEYFRAME_VERSION_FIELD_NUMBER: _ClassVar[int]
    head_version: int
    chain_start_version: int
    first_version: int
    created_unix_nanos: int
    updated_unix_nanos: int
    stored_bytes: int
    version_count: int
    labels: _containers.ScalarMap[str, str]
    forked_from_session_id: str
    forked_from_version: int
    message_type: str
    blob_refs_unchecked: bool
    open_keyframe_version: int
    def __init__(self, head_version: _Optional[int] = ..., chain_start_version: _Optional[int] = ..., first_version: _Optional[int] = ..., created_unix_nanos: _Optional[int] = ..., updated_unix_nanos: _Optional[int] = ..., stored_bytes: _Optional[int] = ..., version_count: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., forked_from_session_id: _Optional[str] = ..., forked_from_version: _Optional[int] = ..., message_type: _Optional[str] = ..., blob_refs_unchecked: _Optional[bool] = ..., open_keyframe_version: _Optional[int] = ...) -> None: ...

class VersionRecord(_message.Message):
    __slots__ = ("created_unix_nanos", "mode", "labels", "message_type", "written_state_xxh3")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CREATED_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    WRITTEN_STATE_XXH3_FIELD_NUMBER: _ClassVar[int]
    created_unix_nanos: int
    mode: int
    labels: _containers.ScalarMap[str, str]
    message_type: str
    written_state_xxh3: int
    def __init__(self, created_unix_nanos: _Optional[int] = ..., mode: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., message_type: _Optional[str] = ..., written_state_xxh3: _Optional[int] = ...) -> None: ...

class RequestRecord(_message.Message):
    __slots__ = ("version", "stored_bytes", "frame_kind", "state_size", "expires_unix_nanos", "write_xxh3", "session_created_unix_nanos", "events_first_seq", "events_last_seq", "events_log_created_unix_nanos", "events_had_put", "state_xxh3", "chain_depth", "swept_by_id_time")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    FRAME_KIND_FIELD_NUMBER: _ClassVar[int]
    STATE_SIZE_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    WRITE_XXH3_FIELD_NUMBER: _ClassVar[int]
    SESSION_CREATED_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    EVENTS_LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    EVENTS_LOG_CREATED_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_HAD_PUT_FIELD_NUMBER: _ClassVar[int]
    STATE_XXH3_FIELD_NUMBER: _ClassVar[int]
    CHAIN_DEPTH_FIELD_NUMBER: _ClassVar[int]
    SWEPT_BY_ID_TIME_FIELD_NUMBER: _ClassVar[int]
    version: int
    stored_bytes: int
    frame_kind: int
    state_size: int
    expires_unix_nanos: int
    write_xxh3: int
    session_created_unix_nanos: int
    events_first_seq: int
    events_last_seq: int
    events_log_created_unix_nanos: int
    events_had_put: bool
    state_xxh3: int
    chain_depth: int
    swept_by_id_time: bool
    def __init__(self, version: _Optional[int] = ..., stored_bytes: _Optional[int] = ..., frame_kind: _Optional[int] = ..., state_size: _Optional[int] = ..., expires_unix_nanos: _Optional[int] = ..., write_xxh3: _Optional[int] = ..., session_created_unix_nanos: _Optional[int] = ..., events_first_seq: _Optional[int] = ..., events_last_seq: _Optional[int] = ..., events_log_created_unix_nanos: _Optional[int] = ..., events_had_put: _Optional[bool] = ..., state_xxh3: _Optional[int] = ..., chain_depth: _Optional[int] = ..., swept_by_id_time: _Optional[bool] = ...) -> None: ...

class EventLogRecord(_message.Message):
    __slots__ = ("next_seq", "first_seq", "event_count", "stored_bytes", "created_unix_nanos", "open_block_seq", "updated_unix_nanos", "last_seq_by_type", "types_next_seq")
    class LastSeqByTypeEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    EVENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    OPEN_BLOCK_SEQ_FIELD_NUMBER: _ClassVar[int]
    UPDATED_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_BY_TYPE_FIELD_NUMBER: _ClassVar[int]
    TYPES_NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    next_seq: int
    first_seq: int
    event_count: int
    stored_bytes: int
    created_unix_nanos: int
    open_block_seq: int
    updated_unix_nanos: int
    last_seq_by_type: _containers.ScalarMap[str, int]
    types_next_seq: int
    def __init__(self, next_seq: _Optional[int] = ..., first_seq: _Optional[int] = ..., event_count: _Optional[int] = ..., stored_bytes: _Optional[int] = ..., created_unix_nanos: _Optional[int] = ..., open_block_seq: _Optional[int] = ..., updated_unix_nanos: _Optional[int] = ..., last_seq_by_type: _Optional[_Mapping[str, int]] = ..., types_next_seq: _Optional[int] = ...) -> None: ...

class StoredEvent(_message.Message):
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

class EventBlock(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[StoredEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[StoredEvent, _Mapping]]] = ...) -> None: ...

class BlobRecord(_message.Message):
    __slots__ = ("size_bytes", "media_type", "created_unix_nanos", "ref_count", "xxh3_128")
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEDIA_TYPE_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    REF_COUNT_FIELD_NUMBER: _ClassVar[int]
    XXH3_128_FIELD_NUMBER: _ClassVar[int]
    size_bytes: int
    media_type: str
    created_unix_nanos: int
    ref_count: int
    xxh3_128: bytes
    def __init__(self, size_bytes: _Optional[int] = ..., media_type: _Optional[str] = ..., created_unix_nanos: _Optional[int] = ..., ref_count: _Optional[int] = ..., xxh3_128: _Optional[bytes] = ...) -> None: ...

class BlobRefRecord(_message.Message):
    __slots__ = ("created_unix_nanos",)
    CREATED_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    created_unix_nanos: int
    def __init__(self, created_unix_nanos: _Optional[int] = ...) -> None: ...

class BlobCommit(_message.Message):
    __slots__ = ("session_id", "sha256", "size_bytes", "media_type", "temp_name", "xxh3_128")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEDIA_TYPE_FIELD_NUMBER: _ClassVar[int]
    TEMP_NAME_FIELD_NUMBER: _ClassVar[int]
    XXH3_128_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    sha256: str
    size_bytes: int
    media_type: str
    temp_name: str
    xxh3_128: bytes
    def __init__(self, session_id: _Optional[str] = ..., sha256: _Optional[str] = ..., size_bytes: _Optional[int] = ..., media_type: _Optional[str] = ..., temp_name: _Optional[str] = ..., xxh3_128: _Optional[bytes] = ...) -> None: ...

class FieldHistory(_message.Message):
    __slots__ = ("fields",)
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    fields: _containers.RepeatedCompositeFieldContainer[FieldUse]
    def __init__(self, fields: _Optional[_Iterable[_Union[FieldUse, _Mapping]]] = ...) -> None: ...

class FieldUse(_message.Message):
    __slots__ = ("message", "number", "kind", "name", "extension")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    EXTENSION_FIELD_NUMBER: _ClassVar[int]
    message: str
    number: int
    kind: str
    name: str
    extension: bool
    def __init__(self, message: _Optional[str] = ..., number: _Optional[int] = ..., kind: _Optional[str] = ..., name: _Optional[str] = ..., extension: _Optional[bool] = ...) -> None: ...
