from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Step(_message.Message):
    __slots__ = ("checkpoint_id", "parent_checkpoint_id", "checkpoint", "metadata", "channels", "deleted_checkpoint_ids", "items", "writes_after_seq")
    class ChannelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Typed
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Typed, _Mapping]] = ...) -> None: ...
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    DELETED_CHECKPOINT_IDS_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    WRITES_AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    parent_checkpoint_id: str
    checkpoint: Typed
    metadata: Typed
    channels: _containers.MessageMap[str, Typed]
    deleted_checkpoint_ids: _containers.RepeatedScalarFieldContainer[str]
    items: _containers.RepeatedCompositeFieldContainer[Items]
    writes_after_seq: int
    def __init__(self, checkpoint_id: _Optional[str] = ..., parent_checkpoint_id: _Optional[str] = ..., checkpoint: _Optional[_Union[Typed, _Mapping]] = ..., metadata: _Optional[_Union[Typed, _Mapping]] = ..., channels: _Optional[_Mapping[str, Typed]] = ..., deleted_checkpoint_ids: _Optional[_Iterable[str]] = ..., items: _Optional[_Iterable[_Union[Items, _Mapping]]] = ..., writes_after_seq: _Optional[int] = ...) -> None: ...

class Items(_message.Message):
    __slots__ = ("channel", "start", "values")
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    channel: str
    start: int
    values: _containers.RepeatedCompositeFieldContainer[Typed]
    def __init__(self, channel: _Optional[str] = ..., start: _Optional[int] = ..., values: _Optional[_Iterable[_Union[Typed, _Mapping]]] = ...) -> None: ...

class Typed(_message.Message):
    __slots__ = ("type", "data")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    type: str
    data: bytes
    def __init__(self, type: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class Writes(_message.Message):
    __slots__ = ("checkpoint_id", "task_id", "task_path", "writes")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_PATH_FIELD_NUMBER: _ClassVar[int]
    WRITES_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    task_id: str
    task_path: str
    writes: _containers.RepeatedCompositeFieldContainer[Write]
    def __init__(self, checkpoint_id: _Optional[str] = ..., task_id: _Optional[str] = ..., task_path: _Optional[str] = ..., writes: _Optional[_Iterable[_Union[Write, _Mapping]]] = ...) -> None: ...

class Write(_message.Message):
    __slots__ = ("idx", "channel", "value")
    IDX_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    idx: int
    channel: str
    value: Typed
    def __init__(self, idx: _Optional[int] = ..., channel: _Optional[str] = ..., value: _Optional[_Union[Typed, _Mapping]] = ...) -> None: ...
