"""The event log's requests and replies <-> the store's calls (AppendEvents, ReadEvents)."""

from __future__ import annotations

from ckpt.store.v1 import records_pb2
from ckpt.v1 import service_pb2

from ..errors import InvalidArgument
from ..limits import EVENT_TIME_RANGE, MAX_EVENT_TIME_NANOS, MIN_EVENT_TIME_NANOS
from ..store import AppendResult, EventPage, EventQuery, NewEvent, PutRequest
from ..store.eventlog import MAX_EVENTS_PER_APPEND
from .convert import labels_arg, put_request, put_response_pb, time_filter_nanos


def append_args(
    request: service_pb2.AppendEventsRequest,
) -> tuple[list[NewEvent], PutRequest | None]:
    """An AppendEvents' events and put, as the store takes them (InvalidArgument naming a bad field)."""
    if len(request.events) > MAX_EVENTS_PER_APPEND:  # before anything is copied
        raise InvalidArgument(
            f"events has {len(request.events)} entries; the limit is {MAX_EVENTS_PER_APPEND} events per append"
        )
    events = []
    for i, event in enumerate(request.events):
        when = None
        if event.HasField("time"):
            try:
                when = time_filter_nanos(
                    event,
                    "time",
                    earliest=MIN_EVENT_TIME_NANOS,
                    latest=MAX_EVENT_TIME_NANOS,
                    time_range=EVENT_TIME_RANGE,
                )
            except InvalidArgument as exc:
                raise InvalidArgument(f"events[{i}].{exc}") from None
        attributes = labels_arg(event.attributes, f"events[{i}].attributes") if event.attributes else {}
        events.append(NewEvent(event.type, event.payload, attributes, when))
    put = None
    if request.HasField("put"):
        try:
            put = put_request(request.put)
        except InvalidArgument as exc:  # named as the nested field it is, as the store names the put's others
            raise InvalidArgument(f"put.{exc}") from None
    return events, put


def append_response_pb(result: AppendResult) -> service_pb2.AppendEventsResponse:
    reply = service_pb2.AppendEventsResponse(
        first_seq=result.first_seq, last_seq=result.last_seq, replayed=result.replayed, log_last_seq=result.log_last_seq
    )
    if result.put is not None:
        reply.put.CopyFrom(put_response_pb(result.put))
    return reply


def event_query(request: service_pb2.ReadEventsRequest) -> EventQuery:
    return EventQuery(
        after_seq=request.after_seq,
        types=tuple(request.types),
        after_unix_nanos=time_filter_nanos(request, "after"),
        before_unix_nanos=time_filter_nanos(request, "before"),
        newest_first=request.newest_first,
        page_size=request.page_size,
        page_token=request.page_token,
    )


def read_response_pb(page: EventPage) -> service_pb2.ReadEventsResponse:
    """The reply of a page: the stored events' encoding is ckpt.v1.Event's (records.proto), so they are
    serialized once and parsed as the reply, not rebuilt field by field in Python."""
    wire = records_pb2.EventBlock(events=page.events).SerializeToString()
    reply = service_pb2.ReadEventsResponse.FromString(wire)
    reply.next_page_token = page.next_page_token
    if page.log_created_unix_nanos:
        reply.log_created_at.FromNanoseconds(page.log_created_unix_nanos)
    return reply
