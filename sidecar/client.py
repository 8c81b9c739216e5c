"""Python clients for the ckpt sidecar: CheckpointClient (sync) and AsyncCheckpointClient.

    with CheckpointClient("unix:data/ckpt.sock") as ckpt:
        v = ckpt.put("agent-7", state).version
        ckpt.merge("agent-7", patch, expected_version=v)
        state = ckpt.get("agent-7").state

Every put carries a request id (generated unless given) that is reused when the
client retries after a lost reply or an unavailable sidecar, so a retry never
writes twice. gRPC errors become CheckpointError subclasses in one place
(``_translate``); a version conflict is a ConflictError carrying the head.
"""

from __future__ import annotations

import asyncio
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
_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


class CheckpointError(Exception):
    """A call to the sidecar failed. ``code`` is the gRPC status code."""

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


_ERRORS: dict[grpc.StatusCode, type[CheckpointError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.DATA_LOSS: DataLossError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
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


def _translate(error: grpc.RpcError) -> NoReturn:
    """The one place gRPC errors become CheckpointErrors."""
    code: grpc.StatusCode = error.code()
    details: str = error.details() or code.name
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        details = _over_limit_text(details) or details
    if code in (grpc.StatusCode.ABORTED, grpc.StatusCode.FAILED_PRECONDITION):
        trailers = dict(error.trailing_metadata() or ())
        raise ConflictError(details, code, int(trailers.get(CURRENT_VERSION_KEY, 0))) from None
    raise _ERRORS.get(code, CheckpointError)(details, code) from None


def _options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
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
        session_id=session_id,
        state=state,
        mode=mode,  # type: ignore[arg-type]
        request_id=request_id if request_id is not None else uuid.uuid4().hex,
        labels=dict(labels or {}),
    )
    if expected_version is not None:
        msg.expected_version = expected_version
    return msg


def _retry_delay_seconds(error: grpc.RpcError, *, retry: bool, attempt: int, retries: int) -> float | None:
    """How long to wait before retrying a failed call, or None to give up (both clients' one policy)."""
    if retry and error.code() in _RETRYABLE and attempt < retries:
        return min(0.05 * 2.0**attempt, 1.0)
    return None


# Room in a PutStream message for its batch id and each put's tag and length.
_STREAM_MESSAGE_SLACK_BYTES = 64
_STREAM_PUT_FRAMING_BYTES = 8


def _stream_batches(
    puts: Iterable[service_pb2.PutRequest], batch_size: int, max_message_bytes: int
) -> Iterator[service_pb2.PutStreamRequest]:
    """PutStream messages of up to ``batch_size`` writes each, each message under ``max_message_bytes``.

    Every write gets a request id if it has none. A write too big to share a
    message goes alone (and the server refuses it if it is over its limit).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    room = max_message_bytes - _STREAM_MESSAGE_SLACK_BYTES
    batch: list[service_pb2.PutRequest] = []
    batch_bytes = 0
    n = 0
    for put in puts:
        if not put.request_id:
            put.request_id = uuid.uuid4().hex
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
    """Synchronous client. Thread-safe; one per process is enough."""

    def __init__(
        self,
        target: str,
        *,
        timeout_seconds: float = 30.0,
        retries: int = 3,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self._channel = grpc.insecure_channel(target, options=_options(max_message_bytes))
        self._stub = service_pb2_grpc.CheckpointServiceStub(self._channel)
        self._timeout = timeout_seconds
        self._max_message_bytes = max_message_bytes
        self._retries = retries

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> CheckpointClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _unary(self, method: Any, request: Any, *, retry: bool) -> Any:
        attempt = 0
        while True:
            try:
                return method(request, timeout=self._timeout)
            except grpc.RpcError as exc:
                delay = _retry_delay_seconds(exc, retry=retry, attempt=attempt, retries=self._retries)
                if delay is None:
                    _translate(exc)
                time.sleep(delay)
                attempt += 1

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
        return self._unary(self._stub.Put, msg, retry=True)  # type: ignore[no-any-return]

    def get(self, session_id: str, version: int = 0) -> service_pb2.GetResponse:
        return self._unary(  # type: ignore[no-any-return]
            self._stub.Get, service_pb2.GetRequest(session_id=session_id, version=version), retry=True
        )

    def history(self, session_id: str, *, page_size: int = 100) -> Iterator[service_pb2.VersionInfo]:
        """Every version of a session, newest first (pages fetched as needed)."""
        token = ""
        while True:
            req = service_pb2.ListVersionsRequest(session_id=session_id, page_size=page_size, page_token=token)
            page = self._unary(self._stub.ListVersions, req, retry=True)
            yield from page.versions
            token = page.next_page_token
            if not token:
                return

    def sessions(
        self, *, labels: Mapping[str, str] | None = None, page_size: int = 100
    ) -> Iterator[service_pb2.SessionInfo]:
        """Every session (carrying all of ``labels``, if given), pages fetched as needed."""
        token = ""
        while True:
            req = service_pb2.ListSessionsRequest(
                page_size=page_size, page_token=token, label_filter=dict(labels or {})
            )
            page = self._unary(self._stub.ListSessions, req, retry=True)
            yield from page.sessions
            token = page.next_page_token
            if not token:
                return

    def fork(
        self, session_id: str, new_session_id: str, *, version: int = 0, labels: Mapping[str, str] | None = None
    ) -> service_pb2.SessionInfo:
        req = service_pb2.ForkRequest(
            session_id=session_id, version=version, new_session_id=new_session_id, labels=dict(labels or {})
        )
        return self._unary(self._stub.Fork, req, retry=False).session  # type: ignore[no-any-return]

    def delete(self, session_id: str) -> int:
        req = service_pb2.DeleteSessionRequest(session_id=session_id)
        return self._unary(self._stub.DeleteSession, req, retry=False).deleted_versions  # type: ignore[no-any-return]

    def put_stream(
        self, puts: Iterable[service_pb2.PutRequest], *, batch_size: int = 64
    ) -> Iterator[service_pb2.PutResult]:
        """Send many writes on one stream, ``batch_size`` per message; yield one result per write, in order.

        A message holds fewer writes when ``batch_size`` of them would pass
        ``max_message_bytes``. A failed write is a PutResult with ``error``
        set; the others go on.
        """
        batches = _stream_batches(puts, batch_size, self._max_message_bytes)
        try:
            for response in self._stub.PutStream(batches):
                yield from response.results
        except grpc.RpcError as exc:
            _translate(exc)


class AsyncCheckpointClient:
    """asyncio client with the same methods as CheckpointClient (awaitable)."""

    def __init__(
        self,
        target: str,
        *,
        timeout_seconds: float = 30.0,
        retries: int = 3,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self._channel = grpc.aio.insecure_channel(target, options=_options(max_message_bytes))
        self._stub = service_pb2_grpc.CheckpointServiceStub(self._channel)
        self._timeout = timeout_seconds
        self._max_message_bytes = max_message_bytes
        self._retries = retries

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncCheckpointClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _unary(self, method: Any, request: Any, *, retry: bool) -> Any:
        attempt = 0
        while True:
            try:
                return await method(request, timeout=self._timeout)
            except grpc.RpcError as exc:
                delay = _retry_delay_seconds(exc, retry=retry, attempt=attempt, retries=self._retries)
                if delay is None:
                    _translate(exc)
                await asyncio.sleep(delay)
                attempt += 1

    async def put(
        self,
        session_id: str,
        state: bytes,
        *,
        expected_version: int | None = None,
        request_id: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> service_pb2.PutResponse:
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
        return await self._unary(self._stub.Put, msg, retry=True)  # type: ignore[no-any-return]

    async def get(self, session_id: str, version: int = 0) -> service_pb2.GetResponse:
        req = service_pb2.GetRequest(session_id=session_id, version=version)
        return await self._unary(self._stub.Get, req, retry=True)  # type: ignore[no-any-return]

    async def history(self, session_id: str, *, page_size: int = 100) -> AsyncIterator[service_pb2.VersionInfo]:
        token = ""
        while True:
            req = service_pb2.ListVersionsRequest(session_id=session_id, page_size=page_size, page_token=token)
            page = await self._unary(self._stub.ListVersions, req, retry=True)
            for v in page.versions:
                yield v
            token = page.next_page_token
            if not token:
                return

    async def sessions(
        self, *, labels: Mapping[str, str] | None = None, page_size: int = 100
    ) -> AsyncIterator[service_pb2.SessionInfo]:
        token = ""
        while True:
            req = service_pb2.ListSessionsRequest(
                page_size=page_size, page_token=token, label_filter=dict(labels or {})
            )
            page = await self._unary(self._stub.ListSessions, req, retry=True)
            for s in page.sessions:
                yield s
            token = page.next_page_token
            if not token:
                return

    async def fork(
        self, session_id: str, new_session_id: str, *, version: int = 0, labels: Mapping[str, str] | None = None
    ) -> service_pb2.SessionInfo:
        req = service_pb2.ForkRequest(
            session_id=session_id, version=version, new_session_id=new_session_id, labels=dict(labels or {})
        )
        return (await self._unary(self._stub.Fork, req, retry=False)).session  # type: ignore[no-any-return]

    async def delete(self, session_id: str) -> int:
        req = service_pb2.DeleteSessionRequest(session_id=session_id)
        return (await self._unary(self._stub.DeleteSession, req, retry=False)).deleted_versions  # type: ignore[no-any-return]

    async def put_stream(
        self, puts: Iterable[service_pb2.PutRequest], *, batch_size: int = 64
    ) -> AsyncIterator[service_pb2.PutResult]:
        # Materialised before the call: every request id is assigned before anything is sent.
        batches = list(_stream_batches(puts, batch_size, self._max_message_bytes))
        try:
            async for response in self._stub.PutStream(iter(batches)):
                for result in response.results:
                    yield result
        except grpc.RpcError as exc:
            _translate(exc)
