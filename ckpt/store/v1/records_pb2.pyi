from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class SessionRecord(_message.Message):
    __slots__ = ("head_version", "chain_start_version", "first_version", "created_unix_nanos", "updated_unix_nanos", "stored_bytes", "version_count", "labels", "forked_from_session_id", "forked_from_version", "message_type")
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
    def __init__(self, head_version: _Optional[int] = ..., chain_start_version: _Optional[int] = ..., first_version: _Optional[int] = ..., created_unix_nanos: _Optional[int] = ..., updated_unix_nanos: _Optional[int] = ..., stored_bytes: _Optional[int] = ..., version_count: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., forked_from_session_id: _Optional[str] = ..., forked_from_version: _Optional[int] = ..., message_type: _Optional[str] = ...) -> None: ...

class VersionRecord(_message.Message):
    __slots__ = ("created_unix_nanos", "mode", "labels", "message_type")
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
    created_unix_nanos: int
    mode: int
    labels: _containers.ScalarMap[str, str]
    message_type: str
    def __init__(self, created_unix_nanos: _Optional[int] = ..., mode: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., message_type: _Optional[str] = ...) -> None: ...

class RequestRecord(_message.Message):
    __slots__ = ("version", "stored_bytes", "frame_kind", "state_size", "expires_unix_nanos", "write_xxh3", "session_created_unix_nanos")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    FRAME_KIND_FIELD_NUMBER: _ClassVar[int]
    STATE_SIZE_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    WRITE_XXH3_FIELD_NUMBER: _ClassVar[int]
    SESSION_CREATED_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    version: int
    stored_bytes: int
    frame_kind: int
    state_size: int
    expires_unix_nanos: int
    write_xxh3: int
    session_created_unix_nanos: int
    def __init__(self, version: _Optional[int] = ..., stored_bytes: _Optional[int] = ..., frame_kind: _Optional[int] = ..., state_size: _Optional[int] = ..., expires_unix_nanos: _Optional[int] = ..., write_xxh3: _Optional[int] = ..., session_created_unix_nanos: _Optional[int] = ...) -> None: ...

class BlobRecord(_message.Message):
    __slots__ = ("size_bytes", "media_type", "created_unix_nanos", "ref_count")
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEDIA_TYPE_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    REF_COUNT_FIELD_NUMBER: _ClassVar[int]
    size_bytes: int
    media_type: str
    created_unix_nanos: int
    ref_count: int
    def __init__(self, size_bytes: _Optional[int] = ..., media_type: _Optional[str] = ..., created_unix_nanos: _Optional[int] = ..., ref_count: _Optional[int] = ...) -> None: ...

class BlobRefRecord(_message.Message):
    __slots__ = ("created_unix_nanos",)
    CREATED_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    created_unix_nanos: int
    def __init__(self, created_unix_nanos: _Optional[int] = ...) -> None: ...

class BlobCommit(_message.Message):
    __slots__ = ("session_id", "sha256", "size_bytes", "media_type", "temp_name")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEDIA_TYPE_FIELD_NUMBER: _ClassVar[int]
    TEMP_NAME_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    sha256: str
    size_bytes: int
    media_type: str
    temp_name: str
    def __init__(self, session_id: _Optional[str] = ..., sha256: _Optional[str] = ..., size_bytes: _Optional[int] = ..., media_type: _Optional[str] = ..., temp_name: _Optional[str] = ...) -> None: ...
