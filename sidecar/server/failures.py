"""How a call fails: a store error (or a bug) as the status, details and trailers a call ends with.

The codes come from ``sidecar.status`` (the one map of error classes to codes);
this adds what the server sends with them: bounded details, the head on a
conflict, the words for a bug, and the same status again in the gRPC process
once the store process has answered it over the link.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, NamedTuple, NoReturn

import grpc

from ckpt.v1 import service_pb2

from ..errors import EventSeqConflict, StateTooLarge, StoreError
from ..status import CURRENT_VERSION_KEY, LAST_SEQ_KEY, status_of

log = logging.getLogger("ckpt")

#: The most bytes of UTF-8 in the status details (or a PutError's message) the service sends. Details
#: travel as an HTTP/2 header, percent-encoded past ASCII (3x), and grpc-core clients refuse headers
#: past 8 KiB (some of the time; always past 16 KiB); they cross the link to the gRPC process in a
#: frame no larger than a message. An error quoting the megabytes a client sent was refused by the
#: one and broke the other, stopping the sidecar. The errors quote clients' strings cut short
#: (keys.quoted); this bounds whatever else may quote one.
MAX_DETAILS_BYTES = 2048

_STATUS_BY_VALUE = {code.value[0]: code for code in grpc.StatusCode}


def bounded_details(text: str) -> str:
    """``text``, cut to MAX_DETAILS_BYTES of UTF-8 (saying how long it was) if longer."""
    if len(text) > MAX_DETAILS_BYTES // 4 and len(raw := text.encode(errors="replace")) > MAX_DETAILS_BYTES:
        return f"{raw[:MAX_DETAILS_BYTES].decode(errors='ignore')}... (cut: {len(raw)} bytes)"
    return text


class Failure(NamedTuple):
    """The status a call ends with, its details, and its trailing metadata."""

    code: grpc.StatusCode
    details: str
    trailers: tuple[tuple[str, str], ...] = ()


def failure_of(exc: StoreError, *, state_limit_origin: str = "") -> Failure:
    """What a store error ends a call with; the session's head goes in a trailer (a conflict's).

    ``state_limit_origin``: said after a size error, where the store's max_state_bytes comes from (a
    client cannot see it).
    """
    current = getattr(exc, "current_version", None)
    trailers = ((CURRENT_VERSION_KEY, str(current)),) if current is not None else ()
    if isinstance(exc, EventSeqConflict):
        trailers = ((LAST_SEQ_KEY, str(exc.last_seq)),)
    return Failure(status_of(exc), error_message(exc, state_limit_origin=state_limit_origin), trailers)


def error_message(exc: StoreError, *, state_limit_origin: str = "") -> str:
    """A store error's words as a client reads them (failure_of's details, a PutError's message)."""
    text = str(exc)
    if isinstance(exc, StateTooLarge) and state_limit_origin:
        text = f"{text}; {state_limit_origin}"
    return bounded_details(text)


def failed_inside(rpc: str) -> Failure:
    """What a call that failed on a bug (logged by the caller) ends with."""
    return Failure(grpc.StatusCode.INTERNAL, f"{rpc} failed inside the sidecar; see its log")


def internal_error(rpc: str, exc: Exception) -> StoreError:
    """One write of a stream failed on a bug: logged, and answered INTERNAL (a plain StoreError)."""
    log.error("a write of a %s failed", rpc, exc_info=exc)
    return StoreError(f"the write failed inside the sidecar ({type(exc).__name__}); see its log")


def put_error_pb(error: StoreError, message: str) -> service_pb2.PutError:
    """One write's failure inside a PutStreamResponse."""
    return service_pb2.PutError(
        code=status_of(error).value[0],
        message=message,
        current_version=getattr(error, "current_version", 0),
    )


def put_stream_response(
    results: list[service_pb2.PutResult], batch_id: int, max_bytes: int
) -> service_pb2.PutStreamResponse:
    """A batch's PutStreamResponse, at most ``max_bytes`` (the sidecar's --max-message-bytes): its results
    all in one response, one per write (the clients pair them with their writes so), the longest of its
    errors' messages cut short as far as it takes. A message of up to MAX_DETAILS_BYTES per write made a
    batch of 1000 failed writes several times a small limit, and its answer could not be sent: the stream
    failed, and the client resent the same writes for the same answer."""
    response = service_pb2.PutStreamResponse(results=results, batch_id=batch_id)
    size = response.ByteSize()
    if size <= max_bytes:
        return response
    errors = [r.error for r in response.results if r.WhichOneof("outcome") == "error"]
    lengths = [len(e.message.encode()) for e in errors]
    # Shorter messages only shorten the lengths that prefix them and their results: the response
    # without the messages' bytes takes at most what it takes now without them.
    cap = _cap(lengths, max_bytes - (size - sum(lengths)))
    for error, length in zip(errors, lengths, strict=True):
        if length > cap:
            error.message = _cut(error.message, cap, length)
    return response


def _cap(lengths: list[int], room: int) -> int:
    """The most bytes any one message may keep for all to fit ``room``: the short ones whole, the others
    cut to the same length."""
    left = len(lengths)
    for length in sorted(lengths):
        share = max(room, 0) // left
        if length > share:
            return share
        room, left = room - length, left - 1
    return max(lengths, default=0)


def _cut(text: str, cap: int, length: int) -> str:
    """``text`` (``length`` bytes of UTF-8) cut to at most ``cap`` bytes, saying so if there is room."""
    mark = f"... (cut: {length} bytes)"
    keep = cap - len(mark) if cap >= len(mark) + 16 else cap
    return text.encode()[: max(keep, 0)].decode(errors="ignore") + (mark if keep < cap else "")


async def abort_with(context: grpc.aio.ServicerContext, status: int, meta: Mapping[str, Any]) -> NoReturn:
    """End a call with the status (and its details and trailers) the store process answered."""
    trailers = tuple((str(k), str(v)) for k, v in meta.get("trailers", ()))
    await context.abort(_STATUS_BY_VALUE[status], str(meta.get("details", "")), trailing_metadata=trailers)
    raise AssertionError("unreachable: context.abort raises")
