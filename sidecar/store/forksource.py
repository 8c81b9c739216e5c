"""A fork's source state, read and encoded before the fork's op reaches the writer.

A fork's work grows with its state: decoding the source's chain, checking
the state against its type, compressing it as the fork's FULL frame. All of
it runs on the caller's thread (a worker thread in the sidecar), from a read
transaction, so that the writer, which every session's writes wait for, only
checks in its transaction that the source still holds what was read
(:func:`still_holds`: O(1), no frame decoded) and stores the frame. Should
the source have changed since (deleted and written again, the version
removed, the head moved for a fork of the latest), the writer reads and
encodes it again in its transaction, and fails as that read finds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from google.protobuf.message import DecodeError, Message

from ckpt.store.v1 import records_pb2

from ...codec import ChainEncoder, ChainPolicy, EncodedFrame
from ...codec.decoder import scanned_state_xxh3
from ..errors import DataLoss
from ..storage import ReadTxn
from . import keys
from .layout import Tables
from .reads import read_state
from .records import frame_of, record
from .registry import Registry


@dataclass(frozen=True, slots=True)
class ForkSource:
    """What a fork stores, and what its source held when it was read."""

    #: The source record's creation time: a session deleted and written again has another.
    created_unix_nanos: int
    #: The version forked (a fork of the latest: the head when it was read).
    version: int
    #: The source's message type, and the registry's class for it, when it was read.
    message_type: str
    message_class: type[Message] | None
    #: XXH3-64 of the state forked, as its frame's header records it.
    state_xxh3: int
    #: The fork's type ("": untyped) and the class its encoder compacts MERGE states with.
    typed: str
    compact: type[Message] | None
    #: The fork's encoder, at version 1, and its FULL frame.
    encoder: ChainEncoder
    frame: EncodedFrame


class SourceState(NamedTuple):
    """A fork's source as read: the state forked and what decides the fork's type."""

    state: bytes
    #: The version forked (a fork of the latest: the head its record names).
    version: int
    #: XXH3-64 of the state, as its frame's header records it.
    state_xxh3: int
    #: The message type the version was written with ("": untyped).
    written_as: str
    record: records_pb2.SessionRecord
    #: The registry's class of the source's type (None: untyped, or a type the registry lost).
    message_class: type[Message] | None


def read_source(
    txn: ReadTxn, tables: Tables, registry: Registry, sid: bytes, session_id: str, version: int
) -> SourceState:
    """The source's ``version`` (0: the head) as ``txn`` sees it; NotFound or DataLoss as a read of it."""
    got = read_state(txn, tables, sid, session_id, version)
    state, forked = got.state, got.info
    src = record(txn.get(sid, db=tables.sessions))
    if src.message_type and registry.shared:
        registry.sync(txn)
    message_class = registry.resolve(src.message_type) if src.message_type else None
    return SourceState(state, version or src.head_version, forked.state_xxh3, forked.message_type, src, message_class)


def encode_fork(source: SourceState, policy: ChainPolicy) -> ForkSource:
    """The fork of ``source``: its type, its encoder and its FULL frame."""
    state, src = source.state, source.record
    typed, compact = src.message_type, source.message_class  # the fork is of the same type
    # A type the registry lost (damage) leaves the fork uncompacted, not refused: it copies a state.
    if compact is not None and source.written_as != typed and not parses(compact, state):
        # A version written before the session took its type need not be one: a typed session's every
        # state parses as its type (compaction, masks and clients rely on it), so its fork stays untyped.
        typed, compact = "", None
    encoder = ChainEncoder(policy=policy, compact_message_type=compact)
    frame = encoder.replace(state)
    return ForkSource(
        src.created_unix_nanos,
        source.version,
        src.message_type,
        source.message_class,
        source.state_xxh3,
        typed,
        compact,
        encoder,
        frame,
    )


def still_holds(txn: ReadTxn, tables: Tables, registry: Registry, sid: bytes, version: int, made: ForkSource) -> bool:
    """Whether the source, as ``txn`` sees it, still holds what ``made`` was read from (no frame decoded).

    Its record was created when it was read (not deleted and written
    again), ``version`` resolves to the version read (a fork of the latest:
    the head has not moved) and is still stored, with the same state's
    checksum in its frame's header; its type and the registry's class for it
    are unchanged; and ``made``'s encoder is still at version 1 (a batch
    redone after a later write of the fork's session continued it).
    """
    raw = txn.get(sid, db=tables.sessions)
    if raw is None:
        return False
    try:
        rec = record(raw)
    except DataLoss:
        return False
    target = version or rec.head_version
    if (
        rec.created_unix_nanos != made.created_unix_nanos
        or target != made.version
        or not rec.first_version <= target <= rec.head_version
        or rec.message_type != made.message_type
        or made.encoder.version != 1
    ):
        return False
    if made.message_type:
        if registry.shared:
            registry.sync(txn)
        if registry.resolve(made.message_type) is not made.message_class:
            return False
    value = txn.get(keys.frame_key(sid, target), db=tables.frames)
    return value is not None and recorded_state_xxh3(value) == made.state_xxh3


def recorded_state_xxh3(value: bytes | memoryview) -> int | None:
    """The state's XXH3-64 a stored value's frame header records (codec.decoder.scanned_state_xxh3)."""
    return scanned_state_xxh3(frame_of(value))


def parses(message_class: type[Message], state: bytes) -> bool:
    """Whether ``state`` parses as ``message_class``."""
    try:
        message_class.FromString(state)
    except DecodeError:
        return False
    return True
