"""The stored values: session records, request records, and a frame's value (its metadata, then the frame).

A frames-table value is a u16 LE length, that many bytes of VersionRecord
(the write's time, mode and labels), then the codec's frame (codec/FORMAT.md).
Everything here parses what a read found; a value that does not parse is
DataLoss naming the session and version.
"""

from __future__ import annotations

import struct
from typing import Any

from google.protobuf.message import DecodeError as DecodeProtoError

from ckpt.store.v1 import records_pb2

from ...codec import DecodeError, FrameHeader, FrameKind, parse
from ..errors import DataLoss
from ..storage import ReadTxn
from .layout import Tables
from .types import PutResult, SessionInfo, VersionInfo, WriteMode

META_LEN = struct.Struct("<H")
# A stored mode number's WriteMode: a dict lookup, where WriteMode(n) is an enum call on every cold read.
_MODES = {mode.value: mode for mode in WriteMode}


def record(raw: Any) -> records_pb2.SessionRecord:
    """A session record; DataLoss if it does not parse."""
    try:
        return records_pb2.SessionRecord.FromString(bytes(raw))
    except DecodeProtoError as exc:
        raise DataLoss(f"a session record ({len(raw)} bytes) does not parse: {exc}") from None


def meta_of(value: Any) -> records_pb2.VersionRecord:
    (n,) = META_LEN.unpack_from(value)
    return records_pb2.VersionRecord.FromString(bytes(value[META_LEN.size : META_LEN.size + n]))


def version_record(session_id: str, version: int, value: Any) -> records_pb2.VersionRecord:
    """A stored version's metadata (meta_of); DataLoss naming the version if it does not parse."""
    try:
        return meta_of(value)
    except (struct.error, DecodeProtoError) as exc:
        raise DataLoss(f"session {session_id!r} version {version}: its stored metadata is corrupt: {exc}") from None


def written_state_xxh3(session_id: str, version: int, value: Any) -> int | None:
    """The XXH3-64 a version's state had as written, if a fold stored it compacted since (else None);
    DataLoss if its metadata does not parse."""
    meta = version_record(session_id, version, value)
    return meta.written_state_xxh3 if meta.HasField("written_state_xxh3") else None


def frame_of(value: Any) -> memoryview:
    # A value too short for its length prefix yields no frame (decoding it then fails, naming the version).
    (n,) = META_LEN.unpack_from(value) if len(value) >= META_LEN.size else (len(value),)
    return memoryview(value)[META_LEN.size + n :]


def version_info(session_id: str, version: int, value: Any, *, header: FrameHeader | None = None) -> VersionInfo:
    """What a stored version's metadata and frame header say; DataLoss naming it if they do not parse.

    ``header``: the frame's header as a decode of its chain read it (which checked the state it yields),
    so the frame is not parsed, and its checksum not computed, a second time on a cold read.
    """
    meta = version_record(session_id, version, value)
    mode = _MODES.get(meta.mode)
    if mode is None:
        raise DataLoss(
            f"session {session_id!r} version {version}: its stored metadata is corrupt:"
            f" {meta.mode} is not a valid WriteMode"
        )
    frame = frame_of(value)
    try:
        if header is None:
            header, _ = parse(frame)  # which checks the frame is exactly its header's size
    except DecodeError as exc:  # the frame, not the metadata: its checksum or header
        text = str(exc)
        where = (
            f"session {session_id!r}" if f"version {version}" in text else f"session {session_id!r} version {version}"
        )
        raise DataLoss(f"{where}: {text}") from None
    if header.version != version:  # a sound frame under another version's key: never served as this one
        raise DataLoss(
            f"session {session_id!r} version {version}: the frame stored there is version {header.version}'s"
        )
    return VersionInfo(
        version=version,
        parent_version=version - 1 if mode is not WriteMode.FORK else 0,
        created_unix_nanos=meta.created_unix_nanos,
        frame_kind=header.kind,
        stored_bytes=len(frame),
        state_size=header.state_size,
        labels=dict(meta.labels) if meta.labels else {},
        mode=mode,
        message_type=meta.message_type,
        state_xxh3=header.state_xxh3,
        written_state_xxh3=meta.written_state_xxh3,
    )


def session_info(session_id: str, rec: records_pb2.SessionRecord) -> SessionInfo:
    return SessionInfo(
        session_id=session_id,
        head_version=rec.head_version,
        first_version=rec.first_version,
        created_unix_nanos=rec.created_unix_nanos,
        updated_unix_nanos=rec.updated_unix_nanos,
        labels=dict(rec.labels),
        stored_bytes=rec.stored_bytes,
        version_count=rec.version_count,
        forked_from_session_id=rec.forked_from_session_id,
        forked_from_version=rec.forked_from_version,
        chain_start_version=rec.chain_start_version,
        message_type=rec.message_type,
    )


def expiry_of(raw: Any) -> int | None:
    """A request record's expiry time; None if the record does not parse."""
    try:
        return records_pb2.RequestRecord.FromString(bytes(raw)).expires_unix_nanos
    except DecodeProtoError:
        return None


def request_of_session(done: records_pb2.RequestRecord, rec: records_pb2.SessionRecord | None) -> bool:
    """Whether a current request record was written to the session ``rec`` is now (None: there is none).

    Records outlive a deleted session (keys.request_key) and name the session they were written to by
    its creation time: one of a deleted, earlier holder of the same id answers nothing (RequestIds.remembered),
    and is no damage (`ckpt verify`).
    """
    return rec is not None and done.session_created_unix_nanos == rec.created_unix_nanos


def request_of_current(
    done: records_pb2.RequestRecord,
    rec: records_pb2.SessionRecord | None,
    log: records_pb2.EventLogRecord | None,
) -> bool:
    """Whether a current request record was written to the session as it is now, whichever write finds it.

    An AppendEvents' record names the event log it appended to (``log``: the session's now, None if it has
    none), so it belongs to a session that holds only events as much as to one with versions; a Put's names
    the session record (request_of_session). A log or record made anew after a delete has another creation
    time: a record of the deleted, earlier holder of the same id answers nothing.
    """
    if done.events_log_created_unix_nanos:
        return log is not None and log.created_unix_nanos == done.events_log_created_unix_nanos
    return request_of_session(done, rec)


def record_put(rec: records_pb2.RequestRecord, result: PutResult) -> None:
    """Keep in a request record what :func:`replayed_put` answers a retry of the put that made ``result``."""
    rec.version = result.version
    rec.stored_bytes = result.stored_bytes
    rec.frame_kind = result.frame_kind
    rec.state_size = result.state_size
    rec.state_xxh3 = result.state_xxh3
    rec.chain_depth = result.chain_depth


def replayed_put(done: records_pb2.RequestRecord) -> PutResult:
    """The answer a retry of the put ``done`` records gets (a Put's, or an AppendEvents' put): the first
    answer's, but ``replayed``; a record kept before its chain_depth or state_xxh3 was answers 0 for it."""
    return PutResult(
        done.version,
        done.stored_bytes,
        FrameKind(done.frame_kind),
        done.state_size,
        replayed=True,
        chain_depth=done.chain_depth,
        state_xxh3=done.state_xxh3,
    )


def request_made(done: records_pb2.RequestRecord) -> str:
    """What the write a request record answers for did, for messages: "made version 3", "appended events seq 4..6"."""
    if not done.events_log_created_unix_nanos:
        return f"made version {done.version}"
    did = [f"appended events seq {done.events_first_seq}..{done.events_last_seq}"] if done.events_first_seq else []
    if done.events_had_put:
        did.append(f"made version {done.version}")
    return " and ".join(did)


def log_record(txn: ReadTxn, tables: Tables, sid: bytes) -> records_pb2.EventLogRecord | None:
    """A session's event log record (None: it has no log); DataLoss if it does not parse."""
    if tables.event_logs is None:
        return None
    raw = txn.get(sid, db=tables.event_logs)
    if raw is None:
        return None
    try:
        return records_pb2.EventLogRecord.FromString(bytes(raw))
    except DecodeProtoError as exc:
        raise DataLoss(f"session {printable(sid)!r}: its event log record does not parse: {exc}") from None


def printable(sid: bytes) -> str:
    """A session key for messages, even if it is not UTF-8 (damage)."""
    return sid.decode("utf-8", "backslashreplace")
