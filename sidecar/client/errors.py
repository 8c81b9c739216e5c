"""The clients' errors: the CheckpointError family, and the one place gRPC errors become them.

Every status the sidecar answers is mapped by ``sidecar/status.py`` from one
store error; :func:`translate` maps it back to the client's class for that
error, words grpc's own refusals so that they name the limit or the cause,
and puts a write's request id on the error.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple, NoReturn

import grpc

from ckpt.v1 import service_pb2

from .. import errors as store
from ..status import CURRENT_VERSION_KEY, LAST_SEQ_KEY, STATUS_OF


class CheckpointError(Exception):
    """A call to the sidecar failed. ``code`` is the gRPC status code.

    ``request_id`` is the write's request id (for put and merge; None
    otherwise): after an error that leaves the outcome unknown (UNAVAILABLE,
    DEADLINE_EXCEEDED), resending the same write with it never writes twice.
    """

    request_id: str | None = None
    #: For a put_stream that gave up: the writes it took from ``puts`` and sent
    #: without getting their result, in order, with the request ids they were
    #: sent with (see put_stream). Empty otherwise.
    unanswered: list[service_pb2.PutRequest]

    def __init__(self, message: str, code: grpc.StatusCode) -> None:
        super().__init__(message)
        self.code = code
        self.unanswered = []


class ClientClosedError(ValueError):
    """A call whose client was closed under it (misuse, as a call after ``close()`` is: a ValueError).

    ``request_id``: the write whose outcome is unknown, to resend with it (None
    for a call that writes nothing); ``unanswered``: a put_stream's writes sent
    without a result, as on CheckpointError.
    """

    def __init__(
        self,
        message: str,
        *,
        request_id: str | None = None,
        unanswered: Sequence[service_pb2.PutRequest] = (),
    ) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.unanswered = list(unanswered)


class InvalidArgumentError(CheckpointError):
    pass


class NotFoundError(CheckpointError):
    pass


class AlreadyExistsError(CheckpointError):
    pass


class ConflictError(CheckpointError):
    """The session's head is not the expected version, or its state not the expected one (a put's
    ``expected_state_xxh3``); ``current_version`` is the head's version."""

    def __init__(self, message: str, code: grpc.StatusCode, current_version: int) -> None:
        super().__init__(message, code)
        self.current_version = current_version


class EventConflictError(ConflictError):
    """An append's ``expected_last_seq`` is not the event log's last seq, ``last_seq``; nothing was
    appended nor put."""

    def __init__(self, message: str, code: grpc.StatusCode, last_seq: int) -> None:
        super().__init__(message, code, 0)
        self.last_seq = last_seq


class FailedPreconditionError(CheckpointError):
    """A put named a message type the sidecar has not registered (register_type first), or another than
    its session's; a register_type changed a field incompatibly. Nothing was written."""


class ResourceExhaustedError(CheckpointError):
    pass


class DataLossError(CheckpointError):
    pass


class UnavailableError(CheckpointError):
    pass


class DeadlineExceededError(CheckpointError):
    """No answer within the client's ``timeout_seconds`` (retries included)."""


# The client's error for each store error the sidecar answers with (by the status
# sidecar/status.py gives it); a conflict is answered with the head, so it is built apart.
_OF_STORE_ERROR: dict[type[store.StoreError], type[CheckpointError]] = {
    store.InvalidArgument: InvalidArgumentError,
    store.NotFound: NotFoundError,
    store.AlreadyExists: AlreadyExistsError,
    store.FailedPrecondition: FailedPreconditionError,
    store.ResourceExhausted: ResourceExhaustedError,
    store.DataLoss: DataLossError,
    store.Unavailable: UnavailableError,
}
_ERRORS: dict[grpc.StatusCode, type[CheckpointError]] = {
    **{STATUS_OF[error]: client for error, client in _OF_STORE_ERROR.items()},
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,  # the client's own deadline
}
_CONFLICT = STATUS_OF[store.VersionConflict]
#: The codes whose trailers may carry the session's head (a conflict's).
_HEAD_CODES = {_CONFLICT, grpc.StatusCode.FAILED_PRECONDITION}

# grpc-aio's words when a message could not be sent because the call had
# already ended: it reports INTERNAL with these details instead of the
# call's real status (grpc/grpc#36066). That status is most often the
# connection breaking (the sidecar killed), but can be the sidecar ending
# the stream (a message over its --max-message-bytes, say). The sidecar's
# own INTERNAL errors never read so.
_SEND_FAILED_DETAILS = "Internal error from Core"


def masked_send_failure(error: grpc.RpcError) -> bool:
    return bool(error.code() is grpc.StatusCode.INTERNAL and error.details() == _SEND_FAILED_DETAILS)


def code_of(error: grpc.RpcError) -> grpc.StatusCode:
    """The error's status code for the retry policy: grpc-aio's masked send failure counts as UNAVAILABLE.

    Retried like a broken connection (resends carry the same request ids);
    should it come back every time, :func:`translate` says what it may hide.
    """
    code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE if masked_send_failure(error) else error.code()
    return code


# grpc's own wording when a message is over a channel's limit, e.g.
# "CLIENT: Sent message larger than max (67108921 vs. 67108864)", at times
# wrapped ("Stream removed (...)").
_OVER_LIMIT = re.compile(r"(CLIENT|SERVER): (Sent|Received) message larger than max \((\d+) vs\. (\d+)\)")


def _over_limit_text(details: str) -> str | None:
    """``details`` in words naming the limit, when grpc refused an oversized message."""
    m = _OVER_LIMIT.search(details)
    if m is None:
        return None
    side, verb, size, limit = m.groups()
    message = "request" if (side, verb) in (("CLIENT", "Sent"), ("SERVER", "Received")) else "reply"
    holder = "this client's" if side == "CLIENT" else "the sidecar's"
    option = "max_message_bytes" if side == "CLIENT" else "--max-message-bytes"
    return f"the {message} is {size} bytes, over {holder} message limit ({option} = {limit})"


def translate(
    error: grpc.RpcError,
    *,
    attempts: int = 1,
    timeout_seconds: float | None = None,
    request_id: str | None = None,
    target: str = "",
) -> NoReturn:
    """The one place gRPC errors become CheckpointErrors.

    ``attempts`` (when more than one), ``timeout_seconds`` and the sidecar's
    ``target`` go into the message; ``request_id`` (a write's) goes on the error.
    """
    code: grpc.StatusCode = error.code()
    details: str = error.details() or code.name
    if masked_send_failure(error):
        details = (
            "the call ended while this client was still sending, and gRPC hides why (it says INTERNAL 'Internal"
            " error from Core', grpc/grpc#36066): the connection broke, or the sidecar refused a message (one"
            " over its --max-message-bytes, say); a write's outcome is unknown, resend it with the same request_id"
        )
    elif code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        details = _over_limit_text(details) or details
    elif code is grpc.StatusCode.DEADLINE_EXCEEDED and timeout_seconds is not None:
        # gRPC names the address when it cannot connect, not when a sidecar it reached stops answering.
        at = f" at {target}" if target else ""
        details = f"the sidecar{at} did not answer within the call's timeout (timeout_seconds={timeout_seconds})"
    elif code is grpc.StatusCode.CANCELLED:  # see policy.RETRYABLE
        code = grpc.StatusCode.UNAVAILABLE
        details = (
            f"the call was cancelled ({details}): the sidecar is shutting down (or this client was closed);"
            " a write's outcome is unknown, resend it with the same request_id"
        )
    if attempts > 1:
        details = f"{details} (gave up after {attempts} attempts)"
    result: CheckpointError
    trailers = dict(error.trailing_metadata() or ()) if code in _HEAD_CODES else {}
    # A conflict is ABORTED; FAILED_PRECONDITION is one too when it carries the head (as the clients always
    # took it), else a message type's refusal.
    if code is _CONFLICT and LAST_SEQ_KEY in trailers:
        try:
            last = int(trailers[LAST_SEQ_KEY])
        except ValueError:
            last = 0
        result = EventConflictError(details, code, last)
    elif code is _CONFLICT or CURRENT_VERSION_KEY in trailers:
        try:
            head = int(trailers.get(CURRENT_VERSION_KEY, 0))
        except ValueError:
            head = 0
        result = ConflictError(details, code, head)
    else:
        result = _ERRORS.get(code, CheckpointError)(details, code)
    result.request_id = request_id
    raise result from None


class Unknown(NamedTuple):
    """What a call closed under its client leaves unknown: said in the error, and kept on it."""

    text: str
    request_id: str | None = None
    unanswered: Sequence[service_pb2.PutRequest] = ()


def unknown_write(request_id: str | None) -> Unknown | None:
    if not request_id:
        return None
    return Unknown(f"the write's outcome is unknown: resend it with request_id {request_id!r}", request_id)


def closed_during(client_name: str, unknown: Unknown | None) -> ClientClosedError:
    """What a call gets when its client is closed under it (misuse: ValueError, as for a call after close())."""
    message = f"this {client_name} was closed during the call"
    if unknown is None:
        return ClientClosedError(message)
    return ClientClosedError(f"{message}; {unknown.text}", request_id=unknown.request_id, unanswered=unknown.unanswered)
