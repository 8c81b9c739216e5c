"""Engine types <-> protobuf messages, and request bytes -> messages (InvalidArgument naming what is wrong)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from google.protobuf.message import DecodeError, Message
from google.protobuf.timestamp_pb2 import Timestamp

from ckpt.v1 import service_pb2

from ...codec import FrameKind, count_fields, invalid_utf8_field
from ..config import MAX_STREAM_BATCH_PUTS
from ..errors import InvalidArgument
from ..limits import FILTER_TIME_RANGE, MAX_FILTER_TIME_NANOS, MIN_FILTER_TIME_NANOS
from ..store import GetResult, PutRequest, PutResult, SessionInfo, VersionInfo, WriteMode, keys


def _timestamp(nanos: int) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(nanos)
    return ts


def time_filter_nanos(
    request: Message,
    field_name: str,
    *,
    earliest: int = MIN_FILTER_TIME_NANOS,
    latest: int = MAX_FILTER_TIME_NANOS,
    time_range: str = FILTER_TIME_RANGE,
) -> int | None:
    """A Timestamp field in nanoseconds (None if unset), or InvalidArgument naming it and the times it may
    hold (a filter's by default: the store keys times as unsigned 64-bit nanoseconds, keys.time_key;
    earlier ones act as the epoch)."""
    if not request.HasField(field_name):
        return None
    ts: Timestamp = getattr(request, field_name)
    nanos = ts.seconds * 1_000_000_000 + ts.nanos
    if 0 <= ts.nanos <= 999_999_999 and earliest <= nanos <= latest:
        return nanos
    raise InvalidArgument(
        f"{field_name} (seconds={ts.seconds}, nanos={ts.nanos}) is out of range: it must be a time from"
        f" {time_range}, with nanos in 0..999,999,999"
    )


_FRAME_KIND_PB = {
    FrameKind.FULL: service_pb2.FRAME_KIND_FULL,
    FrameKind.DELTA: service_pb2.FRAME_KIND_DELTA,
    FrameKind.PATCH: service_pb2.FRAME_KIND_PATCH,
    FrameKind.PREFIX: service_pb2.FRAME_KIND_PREFIX,
}
# A fork's version 1 has no write mode of its own.
_WRITE_MODE_PB = {
    WriteMode.REPLACE: service_pb2.WRITE_MODE_REPLACE,
    WriteMode.MERGE: service_pb2.WRITE_MODE_MERGE,
    WriteMode.FORK: service_pb2.WRITE_MODE_UNSPECIFIED,
}


def version_info_pb(info: VersionInfo, state: bytes = b"") -> service_pb2.VersionInfo:
    msg = service_pb2.VersionInfo(
        version=info.version,
        parent_version=info.parent_version,
        created_at=_timestamp(info.created_unix_nanos),
        frame_kind=_FRAME_KIND_PB[info.frame_kind],
        stored_bytes=info.stored_bytes,
        state_size=info.state_size,
        mode=_WRITE_MODE_PB[info.mode],
        state=state,
        state_xxh3=info.state_xxh3,
    )
    if info.labels:  # an empty map given to the constructor costs ~1.3 us; most versions carry none
        msg.labels.update(info.labels)
    return msg


def versions_with_states_pb(got: Sequence[GetResult], *, as_suffixes: bool) -> list[service_pb2.VersionInfo]:
    """A ListVersions page's versions with their states, newest first. ``as_suffixes``
    (ListVersionsRequest.states_as_suffixes): a state that begins with the next older entry's is sent as the
    bytes after it (``state_suffix``), so that a growing conversation's page holds each step's bytes once."""
    out = []
    for i, read in enumerate(got):
        state = read.state
        older = got[i + 1].state if as_suffixes and i + 1 < len(got) else None
        if older is not None and state.startswith(older):
            msg = version_info_pb(read.info)
            msg.state_suffix = state[len(older) :]
        else:
            msg = version_info_pb(read.info, state)
        out.append(msg)
    return out


def get_response_pb(got: GetResult) -> service_pb2.GetResponse:
    """The reply to a Get, whichever process read it (the store process, or the gRPC process's own read)."""
    return service_pb2.GetResponse(
        version=got.version, state=got.state, info=version_info_pb(got.info), message_type=got.info.message_type
    )


def session_info_pb(info: SessionInfo) -> service_pb2.SessionInfo:
    return service_pb2.SessionInfo(
        session_id=info.session_id,
        head_version=info.head_version,
        created_at=_timestamp(info.created_unix_nanos),
        updated_at=_timestamp(info.updated_unix_nanos),
        labels=info.labels,
        stored_bytes=info.stored_bytes,
        version_count=info.version_count,
        forked_from_session_id=info.forked_from_session_id,
        forked_from_version=info.forked_from_version,
        message_type=info.message_type,
    )


def put_response_pb(r: PutResult) -> service_pb2.PutResponse:
    return service_pb2.PutResponse(
        version=r.version,
        stored_bytes=r.stored_bytes,
        frame_kind=_FRAME_KIND_PB[r.frame_kind],
        replayed=r.replayed,
        state_size=r.state_size,
        state_xxh3=r.state_xxh3,
    )


def put_request(msg: service_pb2.PutRequest) -> PutRequest:
    if msg.mode in (service_pb2.WRITE_MODE_UNSPECIFIED, service_pb2.WRITE_MODE_REPLACE):
        mode = WriteMode.REPLACE
    elif msg.mode == service_pb2.WRITE_MODE_MERGE:
        mode = WriteMode.MERGE
    else:
        raise InvalidArgument(f"mode {msg.mode} is not a WriteMode (REPLACE = 1, MERGE = 2)")
    return PutRequest(
        session_id=msg.session_id,
        state=msg.state,
        mode=mode,
        expected_version=msg.expected_version if msg.HasField("expected_version") else None,
        request_id=msg.request_id,
        labels=labels_arg(msg.labels, "labels") if msg.labels else {},  # most writes carry none: skip a copy
        message_type=msg.message_type,
        expected_state_xxh3=msg.expected_state_xxh3 if msg.HasField("expected_state_xxh3") else None,
    )


def labels_arg(labels: Mapping[str, str], field: str) -> dict[str, str]:
    """A request's labels map as a dict, refused (as keys.check_labels would) if it has too many
    entries before it is copied: a 10 MB Put of a million labels took 0.65 s of the event loop and
    126 MB to copy, only to be refused."""
    if len(labels) > keys.MAX_LABELS:
        raise InvalidArgument(f"{field} has {len(labels)} entries; the limit is {keys.MAX_LABELS}")
    return dict(labels)


def request_parser(request_type: type[Message]) -> Callable[[bytes], Message]:
    """``request_type.FromString``, raising InvalidArgument naming the type for bytes that do not parse."""
    name = request_type.DESCRIPTOR.full_name
    from_string = request_type.FromString

    def parse(raw: bytes) -> Message:
        try:
            return from_string(raw)
        except DecodeError as exc:
            detail = str(exc).removeprefix(f"Error parsing message with type '{name}': ")
            bad = invalid_utf8_field(raw, request_type.DESCRIPTOR)
            if bad is not None:  # protobuf's message names no field
                detail = f"{bad[0]} is not UTF-8 (its bytes at offset {bad[1]})"
            raise InvalidArgument(f"the request is not a valid {name}: {detail}") from None

    return parse


def stream_request_parser() -> Callable[[bytes], Message]:
    """A PutStreamRequest's parser, which refuses one of more than MAX_STREAM_BATCH_PUTS writes
    (InvalidArgument) before parsing it: parsed, each write costs ~90 bytes even if empty (2 on the wire)."""
    parse = request_parser(service_pb2.PutStreamRequest)

    def parse_batch(raw: bytes) -> Message:
        if len(raw) > 2 * MAX_STREAM_BATCH_PUTS:  # a write takes 2 bytes at least: fewer cannot be too many
            puts = count_fields(raw, 1, stop=MAX_STREAM_BATCH_PUTS + 1)  # field 1: PutStreamRequest.puts
            if puts > MAX_STREAM_BATCH_PUTS:
                raise InvalidArgument(
                    f"puts has more than {MAX_STREAM_BATCH_PUTS} entries; the limit is {MAX_STREAM_BATCH_PUTS}"
                    " writes per PutStreamRequest (send more messages)"
                )
        return parse(raw)

    return parse_batch
