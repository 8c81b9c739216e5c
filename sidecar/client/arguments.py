"""The clients' arguments, refused here by name before anything is sent, and the requests built from them."""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import AsyncIterable, Iterable, Mapping, Sequence
from typing import TypeVar

from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from ckpt.v1 import service_pb2

from ..descriptors import descriptor_set
from ..limits import (
    FILTER_TIME_RANGE,
    MAX_DURATION_SECONDS,
    MAX_FILTER_TIME_NANOS,
    MAX_MESSAGE_BYTES,
    MAX_STREAM_BATCH_PUTS,
    MIN_FILTER_TIME_NANOS,
)
from .putbytes import PutCall

_UINT64_MAX = 2**64 - 1
_MAX_PAGE_SIZE = 1000  # the sidecar's cap (service.proto)
_MIN_MESSAGE_BYTES = 1024


def check_str(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:  # protobuf would raise it, naming nothing
            raise ValueError(
                f"{name} is not valid UTF-8: a lone surrogate {value[exc.start]!r} at index {exc.start}"
                " (text decoded with surrogateescape?)"
            ) from None
    return value


def _bytes(name: str, value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{name} must be bytes, not {type(value).__name__}")


def check_int(name: str, value: object, *, low: int = 0, high: int = _UINT64_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    if value > high:
        raise ValueError(f"{name} must be <= {high}, got {value}")
    return value


def _page_size(value: object) -> int:
    if isinstance(value, int) and not 0 <= value <= _MAX_PAGE_SIZE:
        raise ValueError(f"page_size must be in 0..{_MAX_PAGE_SIZE}, got {value} (0 = the sidecar's default, 100)")
    return check_int("page_size", value, high=_MAX_PAGE_SIZE)


def new_request_id() -> str:
    """A fresh request id: a UUIDv7 (RFC 9562) as 32 hex digits, the time in ms first, then 74 random bits.

    Time-ordered, so the store keeps the records of the request ids written
    together on the same few pages (see sidecar/store/keys.py): with random ids
    each write dirtied a page of its own. Built by hand (``uuid.uuid7`` is
    Python 3.14's): about 1 us, paid on every write that brings no id of its own.
    """
    value = (time.time_ns() // 1_000_000 & _MASK_48) << 80 | int.from_bytes(os.urandom(10), "big")
    return f"{value & _UUID7_KEEP | _UUID7_SET:032x}"


_MASK_48 = (1 << 48) - 1
# The version nibble (7) at bits 76-79 and the variant (0b10) at bits 62-63; every other bit kept.
_UUID7_KEEP = ~(0xF << 76 | 0x3 << 62) & ((1 << 128) - 1)
_UUID7_SET = 0x7 << 76 | 0x2 << 62


def _labels(name: str, labels: object) -> dict[str, str]:
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise TypeError(f"{name} must be a mapping of str to str, not {type(labels).__name__}")
    out = {}
    for key, value in labels.items():
        check_str(f"{name} key {key!r}", key)
        out[key] = check_str(f"{name}[{key!r}]", value)
    return out


def check_client_options(timeout_seconds: object, retries: object, max_message_bytes: object) -> None:
    if isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, (int, float)):
        raise TypeError(f"timeout_seconds must be a number, not {type(timeout_seconds).__name__}")
    if not (0 < timeout_seconds <= MAX_DURATION_SECONDS):  # gRPC's deadline overflows a few centuries out
        raise ValueError(
            f"timeout_seconds must be > 0 and at most {MAX_DURATION_SECONDS} (100 years), got {timeout_seconds}"
        )
    check_int("retries", retries)
    check_int("max_message_bytes", max_message_bytes, low=_MIN_MESSAGE_BYTES, high=MAX_MESSAGE_BYTES)


def check_put_stream(puts: object, batch_size: object, *, aio: bool) -> int:
    """``batch_size``, once ``puts`` is an iterable the client takes (an async one too, with ``aio``)."""
    if not (isinstance(puts, Iterable) or (aio and isinstance(puts, AsyncIterable))):
        if isinstance(puts, AsyncIterable):
            raise TypeError(
                "puts is an async iterable: AsyncCheckpointClient.put_stream takes one; this client an iterable"
            )
        raise TypeError(f"puts must be an iterable of ckpt.v1.PutRequest, not {type(puts).__name__}")
    return check_int("batch_size", batch_size, low=1, high=MAX_STREAM_BATCH_PUTS)  # the sidecar's limit


def put_request(
    session_id: str,
    state: object,
    mode: int,
    expected_version: int | None,
    request_id: str | None,
    labels: Mapping[str, str] | None,
    message: object = None,
    message_type: str | None = None,
    expected_state_xxh3: int | None = None,
) -> PutCall:
    """A Put of ``state`` (bytes) or ``message`` (a protobuf message, sent with its type's name)."""
    checked_id = check_str("session_id", session_id)
    data, typed = _state_and_type(
        "state" if mode == service_pb2.WRITE_MODE_REPLACE else "patch", state, message, message_type
    )
    msg = service_pb2.PutRequest(
        session_id=checked_id,
        mode=mode,  # type: ignore[arg-type]
        # An empty id is none to the sidecar (no retry protection): one is generated, as put_stream does.
        request_id=(check_str("request_id", request_id) if request_id is not None else "") or new_request_id(),
    )
    if typed:
        msg.message_type = typed
    checked_labels = _labels("labels", labels)  # after the fields above, in the order they were always checked
    if checked_labels:  # an empty map passed to the constructor costs ~2 us, most of building a request
        msg.labels.update(checked_labels)
    if expected_version is not None:
        msg.expected_version = check_int("expected_version", expected_version)
    if expected_state_xxh3 is not None:
        msg.expected_state_xxh3 = check_int("expected_state_xxh3", expected_state_xxh3)
    return PutCall(msg, data)


def get_request(
    session_id: str,
    version: int,
    field_mask: Sequence[str] = (),
    events: service_pb2.ReadEventsRequest | None = None,
    known_state_xxh3: int | None = None,
) -> service_pb2.GetRequest:
    request = service_pb2.GetRequest(
        session_id=check_str("session_id", session_id), version=check_int("version", version), events=events
    )
    if known_state_xxh3 is not None:
        request.known_state_xxh3 = check_int("known_state_xxh3", known_state_xxh3)
    if field_mask:
        if isinstance(field_mask, str):  # "handoff" would mask the fields h, a, n, ...
            raise TypeError(f"field_mask must be a sequence of paths, not a str: write ({field_mask!r},)")
        request.field_mask.paths.extend(check_str("field_mask path", path) for path in field_mask)
    return request


def fork_request(
    session_id: str, new_session_id: str, version: int, labels: Mapping[str, str] | None, copy_events: bool = False
) -> service_pb2.ForkRequest:
    if not isinstance(copy_events, bool):
        raise TypeError(f"copy_events must be a bool, not {type(copy_events).__name__}")
    return service_pb2.ForkRequest(
        session_id=check_str("session_id", session_id),
        version=check_int("version", version),
        new_session_id=check_str("new_session_id", new_session_id),
        labels=_labels("labels", labels),
        copy_events=copy_events,
    )


def history_request(
    session_id: str, page_size: int, include_states: bool = False, start_version: int = 0
) -> service_pb2.ListVersionsRequest:
    if not isinstance(include_states, bool):
        raise TypeError(f"include_states must be a bool, not {type(include_states).__name__}")
    return service_pb2.ListVersionsRequest(
        session_id=check_str("session_id", session_id),
        page_size=_page_size(page_size),
        include_states=include_states,
        start_version=check_int("start_version", start_version),
        # The client joins them back (join_state_suffixes): its callers see each version's whole state.
        states_as_suffixes=include_states,
    )


def _when(
    name: str,
    value: object,
    *,
    earliest: int = MIN_FILTER_TIME_NANOS,
    latest: int = MAX_FILTER_TIME_NANOS,
    time_range: str = FILTER_TIME_RANGE,
) -> Timestamp | None:
    """An aware datetime as a Timestamp (a naive one has no single instant: refused; one outside the times
    the field takes, a filter's by default: ValueError naming them); a Timestamp (to the nanosecond, which
    a datetime cannot hold) as it is, for the sidecar to check."""
    if value is None:
        return None
    if isinstance(value, Timestamp):
        return Timestamp(seconds=value.seconds, nanos=value.nanos)
    if not isinstance(value, datetime.datetime):
        raise TypeError(f"{name} must be a datetime.datetime or a Timestamp, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware (e.g. datetime.now(timezone.utc)), got {value!r}")
    nanos = unix_nanos(value)
    if not earliest <= nanos <= latest:
        raise ValueError(f"{name} {value.isoformat()} is out of range: it must be a time from {time_range}")
    ts = Timestamp()
    ts.FromNanoseconds(nanos)
    return ts


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def unix_nanos(value: datetime.datetime) -> int:
    """An aware datetime as nanoseconds since the Unix epoch. Not through astimezone, whose result must be a
    datetime: year 1 with an offset east of UTC (or 9999 west of it) was an OverflowError."""
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


def sessions_request(
    labels: Mapping[str, str] | None,
    page_size: int,
    updated_after: object = None,
    updated_before: object = None,
    prefix: object = "",
) -> service_pb2.ListSessionsRequest:
    return service_pb2.ListSessionsRequest(
        page_size=_page_size(page_size),
        label_filter=_labels("labels", labels),
        updated_after=_when("updated_after", updated_after),
        updated_before=_when("updated_before", updated_before),
        session_id_prefix=check_str("prefix", prefix),
    )


def delete_request(session_id: str) -> service_pb2.DeleteSessionRequest:
    return service_pb2.DeleteSessionRequest(session_id=check_str("session_id", session_id))


def _state_and_type(name: str, data: object, message: object, message_type: str | None) -> tuple[bytes, str]:
    """A write's bytes and message type, from ``data`` (the bytes ``name``) or ``message`` (a protobuf message,
    which names its type): exactly one of them. A patch may leave required fields out (a state already holds
    them); a whole state may not: protobuf's EncodeError names them."""
    if message is None:
        if data is None:
            raise TypeError(f"{name} must be bytes, not NoneType: give {name} (bytes) or message (a protobuf message)")
        return _bytes(name, data), "" if message_type is None else check_str("message_type", message_type)
    if data is not None:
        raise TypeError(f"give {name} or message, not both")
    if not isinstance(message, Message):
        raise TypeError(f"message must be a protobuf message, not {type(message).__name__}")
    if message_type is not None:
        raise TypeError("message names its own type: leave message_type out")
    serialized = message.SerializePartialToString() if name == "patch" else message.SerializeToString()
    return serialized, message.DESCRIPTOR.full_name


def register_request(message: object) -> service_pb2.RegisterTypeRequest:
    """The RegisterType request of a message class (or message, or Descriptor), or of a serialized
    FileDescriptorSet's bytes as they are."""
    if isinstance(message, (bytes, bytearray, memoryview)):
        return service_pb2.RegisterTypeRequest(file_descriptor_set=bytes(message))
    return service_pb2.RegisterTypeRequest(file_descriptor_set=descriptor_set(message))  # type: ignore[arg-type]


M = TypeVar("M", bound=Message)


def parse_state(response: service_pb2.GetResponse, message_class: type[M]) -> M:
    """A Get's state as ``message_class``; ValueError if the version was written as another type."""
    if not isinstance(response, service_pb2.GetResponse):
        raise TypeError(f"response must be a ckpt.v1.GetResponse, not {type(response).__name__}")
    name = message_class.DESCRIPTOR.full_name
    if response.message_type and response.message_type != name:
        raise ValueError(f"version {response.version} holds {response.message_type}, not {name}")
    return message_class.FromString(response.state)
