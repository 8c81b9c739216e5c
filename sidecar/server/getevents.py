"""A Get that also reads events (GetRequest.events): its request checked, its composite reply built and
taken apart, in either process.

The reply is a GetResponse whose `events` (field 5, the last) follows the state's fields. Protobuf
parsers merge concatenated encodings, so a reply kept as bytes (the gRPC process's reply cache) plus
the encoding of a GetResponse holding only `events` is the composite reply, the state not serialized
again; and a forwarded composite reply with its `events` field cut out is the reply a Get without
events gets, kept for the next one.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError

from ckpt.v1 import service_pb2

from ..errors import InvalidArgument
from ..store import EventPage, EventQuery
from ..store.stateevents import named_events_field
from .eventconvert import event_query, read_response_pb

#: GetResponse.events' field number.
_EVENTS_FIELD = 5


def events_query(request: service_pb2.GetRequest) -> EventQuery | None:
    """The events read a Get asks for (None: none); InvalidArgument naming ``events.<field>``."""
    if not request.HasField("events"):
        return None
    nested = request.events
    if nested.session_id not in ("", request.session_id):
        raise InvalidArgument(
            f"events.session_id {nested.session_id!r} is not the session read ({request.session_id!r}): leave it"
            " empty or the same"
        )
    try:
        return event_query(nested)
    except InvalidArgument as exc:
        raise named_events_field(exc) from None


def events_part(page: EventPage) -> bytes:
    """The encoding of a GetResponse holding only ``page``: appended to a Get's reply, the composite."""
    return service_pb2.GetResponse(events=read_response_pb(page)).SerializeToString()


def state_part(body: bytes) -> bytes:
    """A serialized GetResponse without its `events` field: the reply of the same Get without events
    (``body`` itself when it has none). DecodeError if ``body`` is not a well-formed encoding."""
    pieces: list[bytes] = []
    start = i = 0
    end = len(body)
    while i < end:
        field_start = i
        tag, i = _varint(body, i)
        wire = tag & 7
        if wire == 0:
            _, i = _varint(body, i)
        elif wire == 2:
            length, i = _varint(body, i)
            i += length
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise DecodeError(f"wire type {wire} at offset {field_start}")
        if tag >> 3 == _EVENTS_FIELD:
            pieces.append(body[start:field_start])
            start = i
    if i != end:
        raise DecodeError("the last field runs past the end")
    if not start:
        return body
    pieces.append(body[start:])
    return b"".join(pieces)


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(data) or shift > 63:
            raise DecodeError(f"a truncated or overlong varint at offset {i}")
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7
