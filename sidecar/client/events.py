"""The clients' event log methods: ``append_events`` and ``events``, written once for both clients."""

from __future__ import annotations

import abc
import datetime
import functools
from collections.abc import Iterable
from typing import Any, Generic, TypeVar, cast

from google.protobuf.timestamp_pb2 import Timestamp

from ckpt.v1 import service_pb2

from ..limits import EVENT_TIME_RANGE, MAX_EVENT_TIME_NANOS, MIN_EVENT_TIME_NANOS
from .arguments import _when, check_int, check_str, new_request_id
from .base import Unary
from .eventfilter import EventFilter

AppendT = TypeVar("AppendT")
EventsT = TypeVar("EventsT")

#: The sidecar's limit (service.proto): events per append.
MAX_EVENTS_PER_APPEND = 1000


def event(
    type: str,
    payload: bytes = b"",
    *,
    attributes: dict[str, str] | None = None,
    time: datetime.datetime | Timestamp | None = None,
) -> service_pb2.Event:
    """A ckpt.v1.Event to append: its ``type`` (e.g. "tool_call"), ``payload`` bytes (JSON, protobuf, text),
    ``attributes`` to filter by, and ``time`` (an aware datetime or a Timestamp; None: the commit's time)."""
    msg = service_pb2.Event(type=check_str("type", type))
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise TypeError(f"payload must be bytes, not {type_name(payload)}")
    msg.payload = bytes(payload)
    if attributes:
        for key, value in attributes.items():
            check_str(f"attributes key {key!r}", key)
            msg.attributes[key] = check_str(f"attributes[{key!r}]", value)
    when = _when("time", time, earliest=MIN_EVENT_TIME_NANOS, latest=MAX_EVENT_TIME_NANOS, time_range=EVENT_TIME_RANGE)
    if when is not None:
        msg.time.CopyFrom(when)
    return msg


def type_name(value: object) -> str:
    return type(value).__name__


def append_events_request(
    session_id: str,
    events: Iterable[service_pb2.Event],
    put: service_pb2.PutRequest | None,
    request_id: str | None,
    expected_last_seq: int | None = None,
) -> service_pb2.AppendEventsRequest:
    if isinstance(events, (str, bytes)) or not isinstance(events, Iterable):
        raise TypeError(f"events must be an iterable of ckpt.v1.Event, not {type_name(events)}")
    listed = list(events)
    for i, item in enumerate(listed):
        if not isinstance(item, service_pb2.Event):
            raise TypeError(f"events[{i}] must be a ckpt.v1.Event (client.event(...) makes one), not {type_name(item)}")
    if len(listed) > MAX_EVENTS_PER_APPEND:
        raise ValueError(
            f"events has {len(listed)} entries; the sidecar takes at most {MAX_EVENTS_PER_APPEND} per append"
        )
    request = service_pb2.AppendEventsRequest(
        session_id=check_str("session_id", session_id),
        events=listed,
        # Generated when not given, as for put: a retry after a lost reply then appends nothing twice.
        request_id=(check_str("request_id", request_id) if request_id is not None else "") or new_request_id(),
    )
    if put is not None:
        if not isinstance(put, service_pb2.PutRequest):
            raise TypeError(f"put must be a ckpt.v1.PutRequest, not {type_name(put)}")
        request.put.CopyFrom(put)
    if expected_last_seq is not None:
        request.expected_last_seq = check_int("expected_last_seq", expected_last_seq)
    return request


def event_page(client: Any, session_id: str, read: EventFilter, page_token: str = "") -> service_pb2.ReadEventsResponse:
    """One page of ``read`` of ``session_id`` by ``client`` (a CheckpointClient), from ``page_token`` if
    given, retried as ``events`` reads are: the ReadEventsResponse whole, its ``log_created_at`` with it
    (what ``ckpt events --follow`` tells a log written again by)."""
    request = read.request(session_id, page_token)
    return cast(service_pb2.ReadEventsResponse, client._unary(Unary("ReadEvents", lambda: request, retry=True)))


class EventMethods(abc.ABC, Generic[AppendT, EventsT]):
    """A mixin of both clients: their ``_unary`` and ``_pages`` do the I/O."""

    def append_events(
        self,
        session_id: str,
        events: Iterable[service_pb2.Event],
        *,
        put: service_pb2.PutRequest | None = None,
        request_id: str | None = None,
        expected_last_seq: int | None = None,
    ) -> AppendT:
        """Append ``events`` (ckpt.v1.Event; :func:`event` makes one) to a session's event log, and with
        ``put`` (a ckpt.v1.PutRequest; its session_id empty or this one) write a checkpoint in the same
        transaction: both are committed, or neither (ConflictError on the put's expected_version or
        expected_state_xxh3 appends nothing). Returns the AppendEventsResponse: ``first_seq``/``last_seq``
        of the events, and ``put``, the checkpoint's PutResponse. Retried as put is, with the same
        ``request_id`` (one is generated if none is given), so a retry appends nothing twice.
        ``expected_last_seq``: append only if the log's last seq is this (0: no event yet), else
        EventConflictError (its ``last_seq``) and nothing is written."""
        build = functools.partial(append_events_request, session_id, events, put, request_id, expected_last_seq)
        return cast(AppendT, self._unary(Unary("AppendEvents", build, retry=True, writes=True)))

    def events(
        self,
        session_id: str,
        *,
        after_seq: int = 0,
        types: Iterable[str] = (),
        after: datetime.datetime | Timestamp | None = None,
        before: datetime.datetime | Timestamp | None = None,
        newest_first: bool = False,
        page_size: int = 100,
        page_token: str = "",
    ) -> EventsT:
        """A session's events (ckpt.v1.Event, each with its ``seq`` and ``time``), oldest first (or
        ``newest_first``), after seq ``after_seq``, of any of ``types`` (empty: all), with a time after
        ``after`` and before ``before`` (aware datetimes, or Timestamps to the nanosecond), if given (the
        filters of :class:`EventFilter`); pages of ``page_size`` fetched as needed, from ``page_token`` if
        given (a page's ``next_page_token``, with the same filters: the rest of a page ``get(...,
        events=...)`` cut).
        NotFoundError if the session has neither events nor versions."""
        read = EventFilter(after_seq, types, after, before, newest_first, page_size)
        return cast(EventsT, self._pages("ReadEvents", read.request(session_id, page_token), "events"))

    @abc.abstractmethod
    def _unary(self, call: Unary) -> Any: ...

    @abc.abstractmethod
    def _pages(self, method: str, request: Any, field: str) -> Any: ...
