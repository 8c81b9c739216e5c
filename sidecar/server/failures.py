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


async def abort_with(context: grpc.aio.ServicerContext, status: int, meta: Mapping[str, Any]) -> NoReturn:
    """End a call with the status (and its details and trailers) the store process answered."""
    trailers = tuple((str(k), str(v)) for k, v in meta.get("trailers", ()))
    await context.abort(_STATUS_BY_VALUE[status], str(meta.get("details", "")), trailing_metadata=trailers)
    raise AssertionError("unreachable: context.abort raises")
