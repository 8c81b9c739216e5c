"""Python clients for the ckpt sidecar: CheckpointClient (sync) and AsyncCheckpointClient.

    with CheckpointClient("unix:data/ckpt.sock") as ckpt:
        v = ckpt.put("agent-7", state).version
        ckpt.merge("agent-7", patch, expected_version=v)
        state = ckpt.get("agent-7").state

Every put carries a request id (generated unless given) that is reused when the
client retries after a lost reply or an unavailable sidecar, so a retry never
writes twice; a write that still fails carries its ``request_id`` on the error,
to resend it safely. ``timeout_seconds`` bounds a whole call, retries included;
UNAVAILABLE is retried (``retries`` times, backing off 0.05 s doubling to 1 s),
so a call outlasts a sidecar restart of about two seconds. gRPC errors become
CheckpointError subclasses in one place (``_translate``); a version conflict is
a ConflictError carrying the head.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from typing import Any, NoReturn, TypeVar

import grpc
import grpc.aio

from ckpt.v1 import service_pb2, service_pb2_grpc

from .config import DEFAULT_MAX_MESSAGE_BYTES
from .status import CURRENT_VERSION_KEY

T = TypeVar("T")
# CANCELLED is what gRPC itself answers a call the sidecar had received but not yet
# started when it began shutting down (the call was never run). These clients never
# cancel a call of their own (an asyncio task's cancellation raises CancelledError
# instead), so a CANCELLED is the sidecar going away: retried, and reported as
# UNAVAILABLE, like every other refusal at shutdown.
_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}


class CheckpointError(Exception):
    """A call to the sidecar failed. ``code`` is the gRPC status code.

    ``request_id`` is the write's request id (for put and merge; None
    otherwise): after an error that leaves the outcome unknown (UNAVAILABLE,
    DEADLINE_EXCEEDED), resending the same write with it never writes twice.
    """

    request_id: str | None = None

    def __init__(self, message: str, code: grpc.StatusCode) -> None:
        super().__init__(message)
        self.code = code


class InvalidArgumentError(CheckpointError):
    pass


class NotFoundError(CheckpointError):
    pass


class AlreadyExistsError(CheckpointError):
    pass


class ConflictError(CheckpointError):
    """The session's head is not the expected version; ``current_version`` is the head."""

    def __init__(self, message: str, code: grpc.StatusCode, current_version: int) -> None:
        super().__init__(message, code)
        self.current_version = current_version


class ResourceExhaustedError(CheckpointError):
    pass


class DataLossError(CheckpointError):
    pass


class UnavailableError(CheckpointError):
    pass


class DeadlineExceededError(CheckpointError):
    """No answer within the client's ``timeout_seconds`` (retries included)."""


_ERRORS: dict[grpc.StatusCode, type[CheckpointError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.DATA_LOSS: DataLossError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
}


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


def _translate(
    error: grpc.RpcError,
    *,
    attempts: int = 1,
    timeout_seconds: float | None = None,
    request_id: str | None = None,
) -> NoReturn:
    """The one place gRPC errors become CheckpointErrors.

    ``attempts`` (when more than one) and ``timeout_seconds`` go into the
    message; ``request_id`` (a write's) goes on the error.
    """
    code: grpc.StatusCode = error.code()
    details: str = error.details() or code.name
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        details = _over_limit_text(details) or details
    elif code is grpc.StatusCode.DEADLINE_EXCEEDED and timeout_seconds is not None:
        details = f"the sidecar did not answer within the call's timeout (timeout_seconds={timeout_seconds})"
    elif code is grpc.StatusCode.CANCELLED:  # see _RETRYABLE
        code = grpc.StatusCode.UNAVAILABLE
        details = (
            f"the call was cancelled ({details}): the sidecar is shutting down (or this client was closed);"
            " a write's outcome is unknown, resend it with the same request_id"
        )
    if attempts > 1:
        details = f"{details} (gave up after {attempts} attempts)"
    result: CheckpointError
    if code in (grpc.StatusCode.ABORTED, grpc.StatusCode.FAILED_PRECONDITION):
        trailers = dict(error.trailing_metadata() or ())
        try:
            head = int(trailers.get(CURRENT_VERSION_KEY, 0))
        except ValueError:
            head = 0
        result = ConflictError(details, code, head)
    else:
        result = _ERRORS.get(code, CheckpointError)(details, code)
    result.request_id = request_id
    raise result from None


# -- arguments: refused here, by name, before anything is sent ---------------------------

_UINT64_MAX = 2**64 - 1
_MAX_PAGE_SIZE = 1000  # the sidecar's cap (service.proto)
_MIN_MESSAGE_BYTES = 1024


def _str(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    return value


def _bytes(name: str, value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{name} must be bytes, not {type(value).__name__}")


def _int(name: str, value: object, *, low: int = 0, high: int = _UINT64_MAX) -> int:
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
    return _int("page_size", value, high=_MAX_PAGE_SIZE)


def _labels(name: str, labels: object) -> dict[str, str]:
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise TypeError(f"{name} must be a mapping of str to str, not {type(labels).__name__}")
    out = {}
    for key, value in labels.items():
        _str(f"{name} key {key!r}", key)
        out[key] = _str(f"{name}[{key!r}]", value)
    return out


def _client_options(timeout_seconds: object, retries: object, max_message_bytes: object) -> None:
    if isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, (int, float)):
        raise TypeError(f"timeout_seconds must be a number, not {type(timeout_seconds).__name__}")
    if not (timeout_seconds > 0 and math.isfinite(timeout_seconds)):
        raise ValueError(f"timeout_seconds must be > 0, got {timeout_seconds}")
    _int("retries", retries)
    _int("max_message_bytes", max_message_bytes, low=_MIN_MESSAGE_BYTES)


def _options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # gRPC waits 1 s, then 1.6x longer each time (up to 2 min), before it
        # reconnects to a sidecar that went away; calls meanwhile fail at once.
        # The sidecar is local: reconnect within the retries' backoff instead.
        ("grpc.initial_reconnect_backoff_ms", 50),
        ("grpc.min_reconnect_backoff_ms", 50),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]


def _put_request(
    session_id: str,
    state: bytes,
    mode: int,
    expected_version: int | None,
    request_id: str | None,
    labels: Mapping[str, str] | None,
) -> service_pb2.PutRequest:
    msg = service_pb2.PutRequest(
        session_id=_str("session_id", session_id),
        state=_bytes("state" if mode == service_pb2.WRITE_MODE_REPLACE else "patch", state),
        mode=mode,  # type: ignore[arg-type]
        request_id=_str("request_id", request_id) if request_id is not None else uuid.uuid4().hex,
        labels=_labels("labels", labels),
    )
    if expected_version is not None:
        msg.expected_version = _int("expected_version", expected_version)
    return msg


def _get_request(session_id: str, version: int) -> service_pb2.GetRequest:
    return service_pb2.GetRequest(session_id=_str("session_id", session_id), version=_int("version", version))


def _fork_request(
    session_id: str, new_session_id: str, version: int, labels: Mapping[str, str] | None
) -> service_pb2.ForkRequest:
    return service_pb2.ForkRequest(
        session_id=_str("session_id", session_id),
        version=_int("version", version),
        new_session_id=_str("new_session_id", new_session_id),
        labels=_labels("labels", labels),
    )


def _history_request(session_id: str, page_size: int) -> service_pb2.ListVersionsRequest:
    return service_pb2.ListVersionsRequest(session_id=_str("session_id", session_id), page_size=_page_size(page_size))


def _sessions_request(labels: Mapping[str, str] | None, page_size: int) -> service_pb2.ListSessionsRequest:
    return service_pb2.ListSessionsRequest(page_size=_page_size(page_size), label_filter=_labels("labels", labels))


def _delete_request(session_id: str) -> service_pb2.DeleteSessionRequest:
    return service_pb2.DeleteSessionRequest(session_id=_str("session_id", session_id))


def _retry_delay_seconds(error: grpc.RpcError, *, retry: bool, attempt: int, retries: int) -> float | None:
    """How long to wait before retrying a failed call, or None to give up (both clients' one policy).

    The callers also give up when the wait would pass the call's deadline, so
    DEADLINE_EXCEEDED, which only the call's own deadline raises, is in
    practice never resent.
    """
    if retry and error.code() in _RETRYABLE and attempt < retries:
        return min(0.05 * 2.0**attempt, 1.0)
    return None


class _Attempts:
    """One call's retry state: the deadline (``timeout_seconds`` from the start) and the attempts made."""

    def __init__(self, timeout_seconds: float, retries: int, retry: bool, request_id: str | None) -> None:
        self.timeout_seconds = timeout_seconds
        self.deadline = time.monotonic() + timeout_seconds
        self.retries = retries
        self.retry = retry
        self.request_id = request_id
        self.made = 0

    def remaining(self) -> float:
        self.made += 1
        return max(self.deadline - time.monotonic(), 0.001)

    def delay_or_raise(self, error: grpc.RpcError) -> float:
        """Seconds to wait before the next attempt; translates ``error`` if there is none."""
        delay = _retry_delay_seconds(error, retry=self.retry, attempt=self.made - 1, retries=self.retries)
        if delay is None or time.monotonic() + delay >= self.deadline:
            _translate(error, attempts=self.made, timeout_seconds=self.timeout_seconds, request_id=self.request_id)
        return delay


# Room in a PutStream message for its batch id and each put's tag and length.
_STREAM_MESSAGE_SLACK_BYTES = 64
_STREAM_PUT_FRAMING_BYTES = 8


def _stream_batches(
    puts: Iterable[service_pb2.PutRequest], batch_size: int, max_message_bytes: int
) -> Iterator[service_pb2.PutStreamRequest]:
    """PutStream messages of up to ``batch_size`` writes each, each message under ``max_message_bytes``.

    Every write without a request id is sent with a new one; the caller's
    messages are not changed (one message given twice is two writes). A write
    too big to share a message goes alone (and the server refuses it if it is
    over its limit).
    """
    room = max_message_bytes - _STREAM_MESSAGE_SLACK_BYTES
    batch: list[service_pb2.PutRequest] = []
    batch_bytes = 0
    n = 0
    for i, put in enumerate(puts):
        if not isinstance(put, service_pb2.PutRequest):
            raise TypeError(f"puts[{i}] is a {type(put).__name__}, not a ckpt.v1.PutRequest")
        if not put.request_id:
            with_id = service_pb2.PutRequest(request_id=uuid.uuid4().hex)
            with_id.MergeFrom(put)
            put = with_id
        size = put.ByteSize() + _STREAM_PUT_FRAMING_BYTES
        if batch and batch_bytes + size > room:
            yield service_pb2.PutStreamRequest(puts=batch, batch_id=n)
            batch, batch_bytes, n = [], 0, n + 1
        batch.append(put)
        batch_bytes += size
        if len(batch) == batch_size:
            yield service_pb2.PutStreamRequest(puts=batch, batch_id=n)
            batch, batch_bytes, n = [], 0, n + 1
    if batch:
        yield service_pb2.PutStreamRequest(puts=batch, batch_id=n)


class CheckpointClient:
    """Synchronous client. Thread-safe; one per process is enough.

    ``timeout_seconds`` bounds each call, its retries included. Put, merge,
    get and the listings retry UNAVAILABLE up to ``retries`` times (writes
    resend the same request id, so a write lands once); fork and delete are
    not retried (a resent fork whose reply was lost would fail with
    ALREADY_EXISTS). ``put_stream`` is not retried: resend the writes of a
    failed stream with request ids of your own.
    """

    def __init__(
        self,
        target: str,
        *,
        timeout_seconds: float = 30.0,
        retries: int = 6,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        _str("target", target)
        _client_options(timeout_seconds, retries, max_message_bytes)
        self._channel = grpc.insecure_channel(target, options=_options(max_message_bytes))
        self._stub = service_pb2_grpc.CheckpointServiceStub(self._channel)
        self._timeout = float(timeout_seconds)
        self._max_message_bytes = max_message_bytes
        self._retries = retries
        self._closed = False

    def close(self) -> None:
        """Close the channel (idempotent); calls after it raise ValueError."""
        self._closed = True
        self._channel.close()

    def __enter__(self) -> CheckpointClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"this {type(self).__name__} is closed")

    def _unary(self, method: Any, request: Any, *, retry: bool, request_id: str | None = None) -> Any:
        self._check_open()
        attempts = _Attempts(self._timeout, self._retries, retry, request_id)
        while True:
            try:
                return method(request, timeout=attempts.remaining())
            except grpc.RpcError as exc:
                delay = attempts.delay_or_raise(exc)
            time.sleep(delay)
            self._check_open()

    def put(
        self,
        session_id: str,
        state: bytes,
        *,
        expected_version: int | None = None,
        request_id: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> service_pb2.PutResponse:
        """Write the whole new state (REPLACE)."""
        return self._write(session_id, state, service_pb2.WRITE_MODE_REPLACE, expected_version, request_id, labels)

    def merge(
        self,
        session_id: str,
        patch: bytes,
        *,
        expected_version: int | None = None,
        request_id: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> service_pb2.PutResponse:
        """Write a partial message merged onto the latest state (MERGE)."""
        return self._write(session_id, patch, service_pb2.WRITE_MODE_MERGE, expected_version, request_id, labels)

    def _write(
        self,
        session_id: str,
        data: bytes,
        mode: int,
        expected_version: int | None,
        request_id: str | None,
        labels: Mapping[str, str] | None,
    ) -> service_pb2.PutResponse:
        # The request (and so its request id) is built once: retries resend it unchanged.
        msg = _put_request(session_id, data, mode, expected_version, request_id, labels)
        return self._unary(self._stub.Put, msg, retry=True, request_id=msg.request_id)  # type: ignore[no-any-return]

    def get(self, session_id: str, version: int = 0) -> service_pb2.GetResponse:
        """Read a version (0 = the latest)."""
        return self._unary(self._stub.Get, _get_request(session_id, version), retry=True)  # type: ignore[no-any-return]

    def history(self, session_id: str, *, page_size: int = 100) -> Iterator[service_pb2.VersionInfo]:
        """Every version of a session, newest first (pages fetched as needed)."""
        return self._pages(self._stub.ListVersions, _history_request(session_id, page_size), "versions")

    def sessions(
        self, *, labels: Mapping[str, str] | None = None, page_size: int = 100
    ) -> Iterator[service_pb2.SessionInfo]:
        """Every session (carrying all of ``labels``, if given), pages fetched as needed."""
        return self._pages(self._stub.ListSessions, _sessions_request(labels, page_size), "sessions")

    def _pages(self, method: Any, req: Any, field: str) -> Iterator[Any]:
        while True:
            page = self._unary(method, req, retry=True)
            yield from getattr(page, field)
            if not page.next_page_token:
                return
            req.page_token = page.next_page_token

    def fork(
        self, session_id: str, new_session_id: str, *, version: int = 0, labels: Mapping[str, str] | None = None
    ) -> service_pb2.SessionInfo:
        """Create ``new_session_id`` whose version 1 is ``version`` (0 = the latest) of ``session_id``."""
        req = _fork_request(session_id, new_session_id, version, labels)
        return self._unary(self._stub.Fork, req, retry=False).session  # type: ignore[no-any-return]

    def delete(self, session_id: str) -> int:
        """Remove a session and all its versions; returns how many versions were removed."""
        req = _delete_request(session_id)
        return self._unary(self._stub.DeleteSession, req, retry=False).deleted_versions  # type: ignore[no-any-return]

    def put_stream(
        self, puts: Iterable[service_pb2.PutRequest], *, batch_size: int = 64
    ) -> Iterator[service_pb2.PutResult]:
        """Send many writes on one stream, ``batch_size`` per message; yield one result per write, in order.

        A message holds fewer writes when ``batch_size`` of them would pass
        ``max_message_bytes``. A failed write is a PutResult with ``error``
        set; the others go on. ``puts`` is read as the stream goes; if reading
        it raises, the writes already sent are answered, then that exception
        is raised. A write without a request id is sent with a new one.
        """
        _int("batch_size", batch_size, low=1)
        self._check_open()
        return self._put_stream(puts, batch_size)

    def _put_stream(self, puts: Iterable[service_pb2.PutRequest], batch_size: int) -> Iterator[service_pb2.PutResult]:
        failed: list[BaseException] = []

        def requests() -> Iterator[service_pb2.PutStreamRequest]:
            # gRPC reads this on its own thread and would swallow an exception
            # (the call ending UNKNOWN, "Exception iterating requests!"): end
            # the stream instead, and raise it here once the answers are in.
            try:
                yield from _stream_batches(puts, batch_size, self._max_message_bytes)
            except Exception as exc:
                failed.append(exc)

        self._check_open()
        try:
            for response in self._stub.PutStream(requests()):
                yield from response.results
        except grpc.RpcError as exc:
            if failed:
                raise failed[0] from None
            _translate(exc)
        if failed:
            raise failed[0]


class AsyncCheckpointClient:
    """asyncio client with the same methods, arguments, errors and retries as CheckpointClient (awaitable)."""

    def __init__(
        self,
        target: str,
        *,
        timeout_seconds: float = 30.0,
        retries: int = 6,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        _str("target", target)
        _client_options(timeout_seconds, retries, max_message_bytes)
        self._channel = grpc.aio.insecure_channel(target, options=_options(max_message_bytes))
        self._stub = service_pb2_grpc.CheckpointServiceStub(self._channel)
        self._timeout = float(timeout_seconds)
        self._max_message_bytes = max_message_bytes
        self._retries = retries
        self._closed = False

    async def close(self) -> None:
        """Close the channel (idempotent); calls after it raise ValueError."""
        self._closed = True
        await self._channel.close()

    async def __aenter__(self) -> AsyncCheckpointClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"this {type(self).__name__} is closed")

    async def _unary(self, method: Any, request: Any, *, retry: bool, request_id: str | None = None) -> Any:
        self._check_open()
        attempts = _Attempts(self._timeout, self._retries, retry, request_id)
        while True:
            try:
                return await method(request, timeout=attempts.remaining())
            except grpc.RpcError as exc:
                delay = attempts.delay_or_raise(exc)
            await asyncio.sleep(delay)
            self._check_open()

    async def put(
        self,
        session_id: str,
        state: bytes,
        *,
        expected_version: int | None = None,
        request_id: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> service_pb2.PutResponse:
        """Write the whole new state (REPLACE)."""
        return await self._write(
            session_id, state, service_pb2.WRITE_MODE_REPLACE, expected_version, request_id, labels
        )

    async def merge(
        self,
        session_id: str,
        patch: bytes,
        *,
        expected_version: int | None = None,
        request_id: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> service_pb2.PutResponse:
        """Write a partial message merged onto the latest state (MERGE)."""
        return await self._write(session_id, patch, service_pb2.WRITE_MODE_MERGE, expected_version, request_id, labels)

    async def _write(
        self,
        session_id: str,
        data: bytes,
        mode: int,
        expected_version: int | None,
        request_id: str | None,
        labels: Mapping[str, str] | None,
    ) -> service_pb2.PutResponse:
        msg = _put_request(session_id, data, mode, expected_version, request_id, labels)
        return await self._unary(self._stub.Put, msg, retry=True, request_id=msg.request_id)  # type: ignore[no-any-return]

    async def get(self, session_id: str, version: int = 0) -> service_pb2.GetResponse:
        """Read a version (0 = the latest)."""
        return await self._unary(self._stub.Get, _get_request(session_id, version), retry=True)  # type: ignore[no-any-return]

    def history(self, session_id: str, *, page_size: int = 100) -> AsyncIterator[service_pb2.VersionInfo]:
        """Every version of a session, newest first (pages fetched as needed)."""
        return self._pages(self._stub.ListVersions, _history_request(session_id, page_size), "versions")

    def sessions(
        self, *, labels: Mapping[str, str] | None = None, page_size: int = 100
    ) -> AsyncIterator[service_pb2.SessionInfo]:
        """Every session (carrying all of ``labels``, if given), pages fetched as needed."""
        return self._pages(self._stub.ListSessions, _sessions_request(labels, page_size), "sessions")

    async def _pages(self, method: Any, req: Any, field: str) -> AsyncIterator[Any]:
        while True:
            page = await self._unary(method, req, retry=True)
            for item in getattr(page, field):
                yield item
            if not page.next_page_token:
                return
            req.page_token = page.next_page_token

    async def fork(
        self, session_id: str, new_session_id: str, *, version: int = 0, labels: Mapping[str, str] | None = None
    ) -> service_pb2.SessionInfo:
        """Create ``new_session_id`` whose version 1 is ``version`` (0 = the latest) of ``session_id``."""
        req = _fork_request(session_id, new_session_id, version, labels)
        return (await self._unary(self._stub.Fork, req, retry=False)).session  # type: ignore[no-any-return]

    async def delete(self, session_id: str) -> int:
        """Remove a session and all its versions; returns how many versions were removed."""
        req = _delete_request(session_id)
        return (await self._unary(self._stub.DeleteSession, req, retry=False)).deleted_versions  # type: ignore[no-any-return]

    def put_stream(
        self, puts: Iterable[service_pb2.PutRequest], *, batch_size: int = 64
    ) -> AsyncIterator[service_pb2.PutResult]:
        """As CheckpointClient.put_stream, except that ``puts`` is read whole before anything is sent
        (so an exception reading it is raised before any write)."""
        _int("batch_size", batch_size, low=1)
        self._check_open()
        return self._put_stream(puts, batch_size)

    async def _put_stream(
        self, puts: Iterable[service_pb2.PutRequest], batch_size: int
    ) -> AsyncIterator[service_pb2.PutResult]:
        batches = list(_stream_batches(puts, batch_size, self._max_message_bytes))
        self._check_open()
        try:
            async for response in self._stub.PutStream(iter(batches)):
                for result in response.results:
                    yield result
        except grpc.RpcError as exc:
            _translate(exc)
