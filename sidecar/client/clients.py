"""Python clients for the ckpt sidecar: CheckpointClient (sync) and AsyncCheckpointClient.

    with CheckpointClient("unix:data/ckpt.sock") as ckpt:
        v = ckpt.put("agent-7", state).version
        ckpt.merge("agent-7", patch, expected_version=v)
        state = ckpt.get("agent-7").state

Every put carries a request id (generated unless given) that is reused when the
client retries after a lost reply or an unavailable sidecar, so a retry never
writes twice; a write that still fails carries its ``request_id`` on the error,
to resend it safely. ``timeout_seconds`` bounds a whole call, retries included;
UNAVAILABLE is retried (``retries`` times, 8 by default, backing off 0.05 s
doubling to 1 s: 4.55 s of waits), so a call outlasts a sidecar restart of
about four seconds. ``put_stream``
outlasts restarts too: a stream that breaks is reopened (the same policy,
counted afresh after every answer) and its unanswered writes resent with their
request ids. gRPC errors become CheckpointError subclasses in one place
(``_translate``); a version conflict is a ConflictError carrying the head.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import logging
import os
import queue
import re
import threading
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, NoReturn, TypeVar

import grpc
import grpc.aio
from google.protobuf.timestamp_pb2 import Timestamp

from ckpt.v1 import service_pb2, service_pb2_grpc

from ..config import (
    DEFAULT_MAX_MESSAGE_BYTES,
    MAX_DURATION_SECONDS,
    MAX_MESSAGE_BYTES,
    MAX_STREAM_BATCH_PUTS,
)
from ..status import CURRENT_VERSION_KEY
from ..tls import ClientTLS as ClientTLS  # re-exported: it is passed to the clients
from ..tls import open_channel

T = TypeVar("T")

log = logging.getLogger(__name__)

# CANCELLED is what gRPC itself answers a call the sidecar had received but not yet
# started when it began shutting down (the call was never run). These clients never
# cancel a call of their own (an asyncio task's cancellation raises CancelledError
# instead), so a CANCELLED is the sidecar going away: retried, and reported as
# UNAVAILABLE, like every other refusal at shutdown.
_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
# grpc-aio's words when a message could not be sent because the call had
# already ended: it reports INTERNAL with these details instead of the
# call's real status (grpc/grpc#36066). That status is most often the
# connection breaking (the sidecar killed), but can be the sidecar ending
# the stream (a message over its --max-message-bytes, say). The sidecar's
# own INTERNAL errors never read so.
_SEND_FAILED_DETAILS = "Internal error from Core"


def _masked_send_failure(error: grpc.RpcError) -> bool:
    return bool(error.code() is grpc.StatusCode.INTERNAL and error.details() == _SEND_FAILED_DETAILS)


def _code_of(error: grpc.RpcError) -> grpc.StatusCode:
    """The error's status code for the retry policy: grpc-aio's masked send failure counts as UNAVAILABLE.

    Retried like a broken connection (resends carry the same request ids);
    should it come back every time, :func:`_translate` says what it may hide.
    """
    code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE if _masked_send_failure(error) else error.code()
    return code


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
    if _masked_send_failure(error):
        details = (
            "the call ended while this client was still sending, and gRPC hides why (it says INTERNAL 'Internal"
            " error from Core', grpc/grpc#36066): the connection broke, or the sidecar refused a message (one"
            " over its --max-message-bytes, say); a write's outcome is unknown, resend it with the same request_id"
        )
    elif code is grpc.StatusCode.RESOURCE_EXHAUSTED:
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


def _new_request_id() -> str:
    """A fresh request id: a UUIDv7 (RFC 9562) as 32 hex digits, the time in ms first, then 74 random bits.

    Time-ordered, so the store keeps the records of the request ids written
    together on the same few pages (see sidecar/keys.py): with random ids each
    write dirtied a page of its own. Built by hand (``uuid.uuid7`` is Python
    3.14's): about 1 us, paid on every write that brings no id of its own.
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
        _str(f"{name} key {key!r}", key)
        out[key] = _str(f"{name}[{key!r}]", value)
    return out


def _client_options(timeout_seconds: object, retries: object, max_message_bytes: object) -> None:
    if isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, (int, float)):
        raise TypeError(f"timeout_seconds must be a number, not {type(timeout_seconds).__name__}")
    if not (0 < timeout_seconds <= MAX_DURATION_SECONDS):  # gRPC's deadline overflows a few centuries out
        raise ValueError(
            f"timeout_seconds must be > 0 and at most {MAX_DURATION_SECONDS} (100 years), got {timeout_seconds}"
        )
    _int("retries", retries)
    _int("max_message_bytes", max_message_bytes, low=_MIN_MESSAGE_BYTES, high=MAX_MESSAGE_BYTES)


def _tls_of(target: str, tls: object) -> ClientTLS | None:
    """The ``tls`` argument as a ClientTLS (True: the system's CAs), or None for plaintext."""
    if tls is False or tls is None:
        return None
    if tls is True:
        tls = ClientTLS()
    if not isinstance(tls, ClientTLS):
        raise TypeError(f"tls must be a ClientTLS, True or False, not {type(tls).__name__}")
    if target.startswith(("unix:", "unix-abstract:")):
        raise ValueError(
            f"tls is for host:port targets; {target!r} is a unix socket, which the sidecar serves without TLS"
            " (its file's permissions guard it)"
        )
    return tls


#: What ``from_env`` reads: the variables the ``ckpt`` command line reads, by the client option they set.
ENV_VARS = {
    "target": "CKPT_TARGET",
    "max_message_bytes": "CKPT_MAX_MESSAGE_BYTES",
    "tls_ca_file": "CKPT_TLS_CA_FILE",
    "tls_client_cert_file": "CKPT_TLS_CLIENT_CERT_FILE",
    "tls_client_key_file": "CKPT_TLS_CLIENT_KEY_FILE",
    "tls_server_name": "CKPT_TLS_SERVER_NAME",
}


def _from_environment(environ: Mapping[str, str], options: dict[str, Any]) -> dict[str, Any]:
    """A client's arguments from CKPT_* variables (see ENV_VARS), ``options`` winning over them."""
    env = {name: value for name, var in ENV_VARS.items() if (value := environ.get(var, ""))}
    out: dict[str, Any] = {}
    if "target" not in options:
        if "target" not in env:
            raise ValueError("CKPT_TARGET is not set: the sidecar's address, unix:/path or host:port")
        out["target"] = env["target"]
    if "max_message_bytes" in env and "max_message_bytes" not in options:
        try:
            out["max_message_bytes"] = int(env["max_message_bytes"])
        except ValueError:
            raise ValueError(f"CKPT_MAX_MESSAGE_BYTES {env['max_message_bytes']!r} is not an integer") from None
    files = {k: env.get(k) for k in ("tls_ca_file", "tls_client_cert_file", "tls_client_key_file")}
    if "tls" not in options and (any(files.values()) or "tls_server_name" in env):
        try:
            out["tls"] = ClientTLS.from_files(
                ca_file=files["tls_ca_file"],
                cert_file=files["tls_client_cert_file"],
                key_file=files["tls_client_key_file"],
                server_name=env.get("tls_server_name"),
            )
        except ValueError as exc:  # named by the variables that set them
            message = str(exc)
            for name, var in ENV_VARS.items():
                message = re.sub(rf"\b{name}\b", var, message)
            raise ValueError(message) from None
    return {**out, **options}


def _options(max_message_bytes: int, *, own_connection: bool = False) -> list[tuple[str, int]]:
    # gRPC shares one connection among a process's channels to the same target
    # (its global subchannel pool); a worker of `ckpt serve --workers` serves
    # whole connections, so a client wanting its own asks for a pool of its own.
    own = [("grpc.use_local_subchannel_pool", 1)] if own_connection else []
    return [
        *own,
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # gRPC waits 1 s, then 1.6x longer each time (up to 2 min), before it
        # reconnects to a sidecar that went away; calls meanwhile fail at once.
        # The sidecar is local: reconnect within the retries' backoff instead.
        # Capped at 1 s, a sidecar back after ~1.8 s was still not reconnected
        # when the last retry ran (then 2.55 s after the first failure); a failed
        # connect to a local socket costs next to nothing, so try every 250 ms.
        ("grpc.initial_reconnect_backoff_ms", 50),
        ("grpc.min_reconnect_backoff_ms", 50),
        ("grpc.max_reconnect_backoff_ms", 250),
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
        # An empty id is none to the sidecar (no retry protection): one is generated, as put_stream does.
        request_id=(_str("request_id", request_id) if request_id is not None else "") or _new_request_id(),
    )
    checked_labels = _labels("labels", labels)  # after the fields above, in the order they were always checked
    if checked_labels:  # an empty map passed to the constructor costs ~2 us, most of building a request
        msg.labels.update(checked_labels)
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


def _when(name: str, value: object) -> Timestamp | None:
    """An aware datetime as a Timestamp (a naive one has no single instant: refused)."""
    if value is None:
        return None
    if not isinstance(value, datetime.datetime):
        raise TypeError(f"{name} must be a datetime.datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware (e.g. datetime.now(timezone.utc)), got {value!r}")
    ts = Timestamp()
    ts.FromDatetime(value.astimezone(datetime.UTC))
    return ts


def _sessions_request(
    labels: Mapping[str, str] | None, page_size: int, updated_after: object = None, updated_before: object = None
) -> service_pb2.ListSessionsRequest:
    return service_pb2.ListSessionsRequest(
        page_size=_page_size(page_size),
        label_filter=_labels("labels", labels),
        updated_after=_when("updated_after", updated_after),
        updated_before=_when("updated_before", updated_before),
    )


def _delete_request(session_id: str) -> service_pb2.DeleteSessionRequest:
    return service_pb2.DeleteSessionRequest(session_id=_str("session_id", session_id))


#: UNAVAILABLE retries of a call by default: waits of 0.05, 0.1, ... 0.8, then 1 s, 4.55 s in all, so that a call
#: outlasts a sidecar restart (~2 s here, 2.7 s on a loaded machine) with room to spare; a sidecar that
#: stays down costs a caller those 4.55 s before the error.
DEFAULT_RETRIES = 8


def _retry_delay_seconds(error: grpc.RpcError, *, retry: bool, attempt: int, retries: int) -> float | None:
    """How long to wait before retrying a failed call, or None to give up (both clients' one policy).

    The callers also give up when the wait would pass the call's deadline, so
    DEADLINE_EXCEEDED, which only the call's own deadline raises, is in
    practice never resent.
    """
    if retry and _code_of(error) in _RETRYABLE and attempt < retries:
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


class _ReadAhead:
    """The sync put_stream's ``puts``, read on a thread of its own a few writes ahead.

    So that a message goes as soon as no further write is ready to join it
    (``ready``), rather than when ``batch_size`` writes have come: an agent
    that gives one write per step would otherwise wait for 63 more before its
    first was even sent. A ``puts`` that gives writes quickly still fills
    whole messages. An exception of ``puts`` is raised in its place, after
    the writes it gave. Each write is copied as it is read (a generator may
    change one message and give it again), and once put_stream has ended
    the reader stops at its next write, which is not sent, like those it had
    read ahead.
    """

    def __init__(self, puts: Iterable[service_pb2.PutRequest], *, depth: int, max_bytes: int) -> None:
        # A SimpleQueue, whose put and get are C calls: a queue.Queue cost ~3x
        # as much per write. The reader stays at most ``depth`` writes and
        # ``max_bytes`` ahead (one write however big).
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._depth = depth
        self._max_bytes = max_bytes
        self._given = self._given_bytes = 0  # written by the reader only
        self._taken = self._taken_bytes = 0  # written by the consumer only
        self._room = threading.Event()
        self._closed = False
        self._ended = False
        self._thread = threading.Thread(target=self._read, args=(puts,), name="ckpt-put-stream-reader", daemon=True)
        self._thread.start()

    def _read(self, puts: Iterable[service_pb2.PutRequest]) -> None:
        end = _PutsEnded(None)
        try:
            for given in puts:
                if self._closed:  # put_stream ended while ``puts`` gave this: it is not sent
                    return
                size = given.ByteSize() if isinstance(given, service_pb2.PutRequest) else 0
                while self._full(size):
                    self._room.clear()  # before the check: a take after it sets the event again
                    if self._full(size):
                        self._room.wait(0.1)  # woken now and then to see close()
                    if self._closed:
                        return
                # Taken before ``puts`` goes on (see _copied).
                self._queue.put((_copied(given), size))
                self._given += 1
                self._given_bytes += size
        except BaseException as exc:  # whatever it is, the consumer must not wait for ever
            end = _PutsEnded(exc)
        self._queue.put(end)

    def _full(self, size: int) -> bool:
        """Whether a write of ``size`` bytes would pass the bounds (one write always fits)."""
        ahead = self._given - self._taken
        return ahead > 0 and (ahead >= self._depth or self._given_bytes - self._taken_bytes + size > self._max_bytes)

    def ready(self) -> bool:
        """Whether the next write (or the end of ``puts``) is here already."""
        return not self._queue.empty()

    def __iter__(self) -> _ReadAhead:
        return self

    def __next__(self) -> Any:
        if self._ended:
            raise StopIteration
        item = self._queue.get()
        if isinstance(item, _PutsEnded):
            self._ended = True
            if item.error is not None:
                raise item.error
            raise StopIteration
        put, size = item
        self._taken_bytes += size
        self._taken += 1  # before looking at the event: see _read
        if not self._room.is_set():
            self._room.set()
        return put

    def close(self) -> None:
        """Stop reading (a read under way inside ``puts`` ends on its own), and end the writes:
        a gRPC request thread waiting for the next one is let go."""
        self._closed = True
        self._room.set()
        self._queue.put(_PutsEnded(None))


class _PutsEnded:
    """The end of ``puts``, with the exception that ended it, if one did."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


def _stream_batches(
    puts: Iterable[service_pb2.PutRequest], batch_size: int, max_message_bytes: int
) -> Iterator[service_pb2.PutStreamRequest]:
    """PutStream messages of up to ``batch_size`` writes each, each message under ``max_message_bytes``.

    From a :class:`_ReadAhead`, a message also goes as soon as no further write is ready.
    Every write without a request id is sent with a new one; the caller's
    messages are not changed (one message given twice is two writes). A write
    too big to share a message goes alone (and the server refuses it if it is
    over its limit); one too big for a message of ``max_message_bytes`` raises
    ResourceExhaustedError (naming it, its request id on the error) in its
    place, as an error of ``puts`` would.
    """
    room = max_message_bytes - _STREAM_MESSAGE_SLACK_BYTES
    read_ahead = puts if isinstance(puts, _ReadAhead) else None
    # An iterator may give one message again, changed (a generator refilling
    # one PutRequest per step): each write is its own copy, taken as given.
    # The read-ahead copies already; a sequence's messages are there at once.
    copy_each = read_ahead is None and not isinstance(puts, Sequence)
    batch: list[service_pb2.PutRequest] = []
    batch_bytes = 0
    n = 0
    try:
        for i, put in enumerate(puts):
            if not isinstance(put, service_pb2.PutRequest):
                raise TypeError(f"puts[{i}] is a {type(put).__name__}, not a ckpt.v1.PutRequest")
            if copy_each or (not put.request_id and read_ahead is None):
                put = _copied(put)
            if not put.request_id:
                put.request_id = _new_request_id()
            size = put.ByteSize() + _STREAM_PUT_FRAMING_BYTES
            if size > room:
                alone = service_pb2.PutStreamRequest(puts=[put], batch_id=n + 1).ByteSize()
                if alone > max_message_bytes:
                    # gRPC would fail the whole stream while sending it, answers
                    # of earlier writes unread, and name no write.
                    error = ResourceExhaustedError(
                        f"puts[{i}] (request_id {put.request_id!r}) needs a {alone}-byte PutStream message, over"
                        f" this client's message limit (max_message_bytes = {max_message_bytes})",
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                    )
                    error.request_id = put.request_id
                    raise error
            if batch and batch_bytes + size > room:
                yield service_pb2.PutStreamRequest(puts=batch, batch_id=n)
                batch, batch_bytes, n = [], 0, n + 1
            batch.append(put)
            batch_bytes += size
            if len(batch) == batch_size or (read_ahead is not None and not read_ahead.ready()):
                yield service_pb2.PutStreamRequest(puts=batch, batch_id=n)
                batch, batch_bytes, n = [], 0, n + 1
    except GeneratorExit:  # this generator closed: nothing more to send
        raise
    except BaseException:
        # ``puts`` (or one of its items) failed (SystemExit and the like too,
        # or the stream would wait for ever): the writes it gave before are
        # the caller's, handed over, so they go too; then the error.
        if batch:
            yield service_pb2.PutStreamRequest(puts=batch, batch_id=n)
        raise
    if batch:
        yield service_pb2.PutStreamRequest(puts=batch, batch_id=n)


# -- put_stream across broken streams (both clients) ---------------------------------------
#
# A put_stream is one or more PutStream calls in a row. The client keeps every batch
# sent and not yet answered; when a call breaks with a status the unary writes retry,
# it opens another and sends those batches again, in order and unchanged (their
# request ids, and batch ids, are the same), then the rest. The sidecar answers a
# resent write it had committed with the first result (replayed=True), so every
# write is made once and answered once, in the caller's order. The server only
# echoes batch_id, so ids stay unique per put_stream and the client checks each
# answer against the batch it is due for.


class _StreamAttempts:
    """put_stream's reconnects: the unary calls' policy and budget (_Attempts) for each run of failures.

    A run starts at a stream's failure (that stream was its first attempt) and
    ends at the next answer, so a long stream outlasts any number of restarts
    spread over its life, while a sidecar that keeps refusing (or keeps
    breaking streams before answering) ends it after ``retries`` reconnects,
    or ``timeout_seconds`` after the failure, as a unary call would.
    """

    def __init__(self, timeout_seconds: float, retries: int) -> None:
        self._timeout = timeout_seconds
        self._retries = retries
        self._run: _Attempts | None = None

    def progress(self) -> None:
        self._run = None

    def would_retry(self, error: grpc.RpcError) -> bool:
        attempt = self._run.made - 1 if self._run is not None else 0
        return _retry_delay_seconds(error, retry=True, attempt=attempt, retries=self._retries) is not None

    def delay_or_raise(self, error: grpc.RpcError) -> float:
        """Seconds to wait before the next stream; translates ``error`` if there is none."""
        if self._run is None:
            self._run = _Attempts(self._timeout, self._retries, True, None)
            self._run.made = 1  # the stream that failed
        delay = self._run.delay_or_raise(error)
        self._run.made += 1  # the stream about to be opened
        return delay


def _with_progress(
    error: CheckpointError, answered: int, unanswered: Sequence[service_pb2.PutStreamRequest]
) -> CheckpointError:
    """``error``, a whole put_stream's, naming how far it got, with its unanswered writes on it
    (``unanswered``; ``request_id`` is the first one's)."""
    writes = _writes_of(unanswered)
    error.unanswered = writes
    error.request_id = writes[0].request_id if writes else None
    progress = _progress(answered, writes)
    error.args = (f"{error.args[0] if error.args else ''}; {progress}", *error.args[1:])
    return error


def _puts_arg(puts: object, *, aio: bool) -> None:
    if isinstance(puts, Iterable) or (aio and isinstance(puts, AsyncIterable)):
        return
    if isinstance(puts, AsyncIterable):
        raise TypeError(
            "puts is an async iterable: AsyncCheckpointClient.put_stream takes one; this client an iterable"
        )
    raise TypeError(f"puts must be an iterable of ckpt.v1.PutRequest, not {type(puts).__name__}")


def _copied(put: Any) -> Any:
    """A copy of a PutRequest, as given now: a generator may change and give the same message again
    (one object, many writes). Anything else as it is, for _stream_batches to name."""
    if not isinstance(put, service_pb2.PutRequest):
        return put
    mine = service_pb2.PutRequest()
    mine.CopyFrom(put)
    return mine


def _writes_of(batches: Sequence[service_pb2.PutStreamRequest]) -> list[service_pb2.PutRequest]:
    return [put for batch in batches for put in batch.puts]


def _progress(answered: int, unanswered: Sequence[service_pb2.PutRequest]) -> str:
    if not unanswered:
        return f"put_stream: all {answered} writes sent were answered"
    return (
        f"put_stream: the first {answered} writes were answered; the next {len(unanswered)} (from request_id"
        f" {unanswered[0].request_id!r}) have no result and may have been written: resend .unanswered as they are"
        f" (their request ids make a committed one a replay), then the writes of puts after them"
        f" (from puts[{answered + len(unanswered)}])"
    )


def _check_answer(response: service_pb2.PutStreamResponse, due: service_pb2.PutStreamRequest | None) -> None:
    """Refuse an answer that is not the next batch's: pairing them is what makes each result the right write's."""
    if due is not None and response.batch_id == due.batch_id and len(response.results) == len(due.puts):
        return
    expected = "none" if due is None else f"batch {due.batch_id}, with {len(due.puts)}"
    raise CheckpointError(
        f"PutStream answered batch {response.batch_id} with {len(response.results)} results where {expected}"
        " was due: the sidecar broke the stream's contract",
        grpc.StatusCode.INTERNAL,
    )


_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]


def _split_answer(
    response: service_pb2.PutStreamResponse, due: service_pb2.PutStreamRequest | None
) -> tuple[list[service_pb2.PutResult], list[service_pb2.PutResult], service_pb2.PutStreamRequest | None]:
    """``due``'s answer as (results to give now, results held back, a batch of the held results' writes).

    A sidecar stopped while its stream waited for room in its write queue
    answers the batch whole, the writes it had not queued UNAVAILABLE (not
    written), and ends the stream: they are a batch's last results, and
    nothing after them was read. So a batch's trailing UNAVAILABLE results
    are held back: if the stream then breaks and is reopened, their writes go
    first on the next one (order kept, request ids the same); if it goes on
    (or ends), they are given as they are.
    """
    _check_answer(response, due)
    assert due is not None
    results = list(response.results)
    held = 0
    while held < len(results) and results[-1 - held].error.code == _UNAVAILABLE:
        held += 1
    if not held:
        return results, [], None
    rest = service_pb2.PutStreamRequest(puts=due.puts[-held:], batch_id=due.batch_id)
    return results[:-held], results[-held:], rest


def _stream_deadline_error(timeout_seconds: float) -> DeadlineExceededError:
    return DeadlineExceededError(
        f"the sidecar did not answer the stream within timeout_seconds={timeout_seconds} (a put_stream waits that"
        " long for each answer while writes are in flight)",
        grpc.StatusCode.DEADLINE_EXCEEDED,
    )


def _unanswered_at_end_error() -> CheckpointError:
    return CheckpointError(
        "the sidecar ended the stream (OK) before every write was sent and answered", grpc.StatusCode.INTERNAL
    )


# How long a put_stream still waits for a stream's answers once the stream has ended: gRPC
# hands over what it had received in a few ms (see _Responses, and _AnswerWait for the async one).
_ENDED_STREAM_GRACE_SECONDS = 1.0


class _Responses:
    """A sync stream call's responses, read on a thread of their own, so that a wait for one ends with the call.

    ``next(call)`` waits for the call's next message to be read, and grpcio
    (1.85) can end a call and leave that read pending for ever: a PutStream
    cut by a stopping sidecar's GOAWAY ("Cancelling all calls") before the
    sidecar took it, which gRPC then retried on its own against the socket
    gone ("failed to connect to all addresses"), ended UNAVAILABLE with its
    message read still due, and ``next`` never returned; ``cancel()`` could
    not end it either, the call being over. Here a wait ends, once the call
    has, after each answer still handed over within
    ``_ENDED_STREAM_GRACE_SECONDS``, as ``next(call)`` called after the end
    would: StopIteration if it ended OK, else the call as its RpcError (the
    reader stays in its read, a daemon thread).
    """

    def __init__(self, call: Any) -> None:
        self._call = call
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._ended = False
        self._last: BaseException | None = None
        threading.Thread(target=self._read, name="ckpt-put-stream-answers", daemon=True).start()
        call.add_done_callback(lambda _: self._queue.put(_CALL_ENDED))  # at once if it has ended

    def _read(self) -> None:
        end: BaseException = StopIteration()
        try:
            for response in self._call:
                self._queue.put(response)
        except BaseException as exc:  # whatever it is, the consumer must not wait for ever
            end = exc
        self._queue.put(_ReadEnded(end))

    def cancel(self) -> None:
        """Cancel the call (a no-op once it has ended); a wait for its answers ends as at the call's end."""
        self._call.cancel()
        self._queue.put(_CALL_ENDED)

    def __next__(self) -> service_pb2.PutStreamResponse:
        if self._last is not None:
            raise self._last
        while True:
            try:
                item = self._queue.get(timeout=_ENDED_STREAM_GRACE_SECONDS if self._ended else None)
            except queue.Empty:
                self._last = StopIteration() if self._call.code() is grpc.StatusCode.OK else self._call
                raise self._last from None
            if item is _CALL_ENDED:
                self._ended = True
            elif isinstance(item, _ReadEnded):
                self._last = item.error
                raise self._last
            else:
                return item  # type: ignore[no-any-return]


_CALL_ENDED = object()


class _ReadEnded(NamedTuple):
    error: BaseException


class _AnswerWait:
    """The async put_stream's waits for a stream's answers: each bounded by ``timeout_seconds``, and once the
    call has ended by _ENDED_STREAM_GRACE_SECONDS, so that a wait ends with the call as _Responses' do.

    A ``read()`` under way returns only when gRPC completes the read's
    operations (the stream's receive_initial_metadata, which grpc.aio's read
    waits for first, then a receive_message), or is cancelled; the call's
    end (its status) wakes done callbacks and status and metadata waiters,
    not a read. So the read grpcio (1.85) can leave pending for ever on a
    call it has ended (see _Responses) would wait out ``timeout_seconds``
    and end the put_stream with DeadlineExceededError, its unanswered writes
    named but not resent, where the stream's end should reopen it. Here the
    call's done callback shortens the wait under way to the grace; if that
    runs out with the call ended, the read ends as a ``read()`` begun after
    the end does (grpc.aio answers that from the status at once): EOF if the
    call ended OK, else the call's error. A wait that runs out of
    ``timeout_seconds`` is TimeoutError as before, though grpc.aio then
    cancels the call (it cancels a call whose read is cancelled).
    """

    def __init__(self, call: Any, timeout_seconds: float) -> None:
        self._call = call
        self._timeout = timeout_seconds
        self._bound: asyncio.Timeout | None = None  # the wait under way
        self._ended = False
        call.add_done_callback(self._call_ended)  # at once if it has ended

    def _call_ended(self, _call: Any) -> None:
        bound = self._bound
        if bound is not None and bound.expired():
            return  # ended by the wait's expiry: grpc.aio cancels a call whose read is cancelled
        self._ended = True
        if bound is not None:
            self._shorten(bound)

    @staticmethod
    def _shorten(bound: asyncio.Timeout) -> None:
        when, deadline = asyncio.get_running_loop().time() + _ENDED_STREAM_GRACE_SECONDS, bound.when()
        if deadline is None or when < deadline:
            bound.reschedule(when)

    async def read(self) -> Any:
        """The call's next answer, or EOF, or the call's error as ``read()`` raises it; TimeoutError after
        ``timeout_seconds`` without an answer (the call not ended before)."""
        try:
            async with asyncio.timeout(self._timeout) as bound:
                self._bound = bound
                try:
                    if self._ended:
                        self._shorten(bound)
                    return await self._call.read()
                finally:
                    self._bound = None
        except TimeoutError:
            if not self._ended:
                raise
        return await self._call.read()  # ended, and its read never completed: the read after the end


class _StreamFeed:
    """The sync put_stream's writes between the caller's ``puts`` and their answers, across its streams.

    gRPC reads each stream's requests on a thread of its own. Batches are
    pulled from ``puts`` one puller at a time (a broken stream's thread may
    still be inside the caller's iterator when the next stream starts) into
    ``_unanswered``, and leave it when answered: memory holds what is in
    flight, not the whole input. Each stream sends the unanswered batches
    from the first, then pulls more; a stream that was replaced stops.

    A watchdog thread cancels a stream whose answer is overdue: one that the
    caller has waited ``timeout_seconds`` for while a write was in flight,
    counted from the later of the wait's start and the last answer (or the
    stream's start, or the first write sent after all were answered). A
    caller slow to take results, or a ``puts`` slow to give writes, never
    counts against the sidecar. A stream's answers are read by _Responses, so
    that a wait for one ends with the stream, whatever gRPC's read does.
    """

    def __init__(self, batches: Iterator[service_pb2.PutStreamRequest], timeout_seconds: float) -> None:
        self._batches = batches
        self._timeout = timeout_seconds
        self._pulling = threading.Lock()  # held while inside the caller's iterator
        self._cond = threading.Condition()  # guards everything below
        self._unanswered: dict[int, service_pb2.PutStreamRequest] = {}
        self._first = 0  # the first unanswered batch; batches are numbered as pulled
        self._pulled = 0
        self._done = False  # puts ended (or raised: failed)
        self._stream = 0  # the current stream; a stream's requests stop once it is not
        self._call: _Responses | None = None
        self._waiting_since: float | None = None
        self._clock = 0.0
        self._closed = False
        self._watchdog: threading.Thread | None = None
        self._held: list[service_pb2.PutResult] = []  # see _split_answer
        self.failed: BaseException | None = None
        self.answered = 0  # writes answered
        self.timed_out = False

    # -- gRPC's request threads (and the caller's, waiting for a write to send)

    def _requests(self, stream: int, n: int) -> Iterator[service_pb2.PutStreamRequest]:
        while (batch := self._batch(n, stream)) is not None:
            yield batch
            n += 1

    def _batch(self, n: int, stream: int) -> service_pb2.PutStreamRequest | None:
        """Batch ``n``, pulled from ``puts`` if need be; None once they are done or ``stream`` is not current."""
        while True:
            with self._cond:
                if stream != self._stream:
                    return None
                if n < self._pulled:
                    return self._unanswered[n]
                if self._done:
                    return None
            with self._pulling:
                with self._cond:
                    if n < self._pulled or self._done:
                        continue  # another stream's thread pulled it meanwhile
                batch: service_pb2.PutStreamRequest | None = None
                failed = None
                try:
                    batch = next(self._batches)
                except StopIteration:
                    pass
                except BaseException as exc:
                    # gRPC would swallow it (the call ending UNKNOWN, "Exception iterating
                    # requests!"; a BaseException ends its request thread, and the stream
                    # waits for ever): end the stream instead; the caller gets it once
                    # the writes sent are answered.
                    failed = exc
                with self._cond:
                    if batch is None:
                        self._done = True
                        self.failed = failed
                        continue
                    if not self._unanswered:
                        self._clock = time.monotonic()
                        self._cond.notify_all()
                    self._unanswered[self._pulled] = batch
                    self._pulled += 1

    # -- the caller's thread

    def open(self, method: Any) -> _Responses:
        """Start a stream (on ``method``, the stub's PutStream) that sends every unanswered batch, then the rest."""
        with self._cond:
            self._stream += 1
            requests = self._requests(self._stream, self._first)
        call = _Responses(method(requests))
        with self._cond:
            self._call = call
            self._clock = time.monotonic()
            if self._watchdog is None:
                self._watchdog = threading.Thread(target=self._watch, name="ckpt-put-stream-watchdog", daemon=True)
                self._watchdog.start()
        return call

    def answers(self, responses: _Responses) -> Iterator[list[service_pb2.PutResult]]:
        """A stream's answers as results to give, each checked against the batch it is due for (_split_answer)."""
        while True:
            with self._cond:
                self._waiting_since = time.monotonic()
                self._cond.notify_all()
            try:
                response: service_pb2.PutStreamResponse | None = next(responses)
            except StopIteration:
                response = None
            except grpc.RpcError:
                with self._cond:
                    self._held = []  # their writes stay unanswered: resent, or named if the stream gives up
                raise
            finally:
                with self._cond:
                    self._waiting_since = None
            with self._cond:
                out = self._release_held()
                if response is not None:
                    now, self._held, rest = _split_answer(response, self._unanswered.get(self._first))
                    if rest is None:
                        del self._unanswered[self._first]
                        self._first += 1
                    else:
                        self._unanswered[self._first] = rest
                    self.answered += len(now)
                    out += now
                    self._clock = time.monotonic()
            if out:
                yield out
            if response is None:
                return

    def _release_held(self) -> list[service_pb2.PutResult]:
        """The held results, given after all (the stream went on or ended): their batch is answered."""
        out, self._held = self._held, []
        if out:
            del self._unanswered[self._first]
            self._first += 1
            self.answered += len(out)
        return out

    def stop(self) -> None:
        """The current stream ended: its request thread sends nothing more."""
        with self._cond:
            self._stream += 1

    def first_unanswered(self) -> service_pb2.PutStreamRequest | None:
        with self._cond:
            return self._unanswered.get(self._first)

    def unanswered_batches(self) -> list[service_pb2.PutStreamRequest]:
        """The batches pulled from ``puts`` and not answered, in order (the first perhaps partly answered)."""
        with self._cond:
            return [self._unanswered[n] for n in range(self._first, self._pulled)]

    @property
    def done(self) -> bool:
        with self._cond:
            return self._done

    def wait_for_write(self) -> None:
        """Block until a write is pulled to be sent, or ``puts`` ends."""
        with self._cond:
            n, stream = self._first, self._stream
        self._batch(n, stream)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._stream += 1
            call = self._call
            self._cond.notify_all()
        if call is not None:
            call.cancel()  # a no-op once it has ended

    def _watch(self) -> None:
        with self._cond:
            while not self._closed:
                if self._waiting_since is None or not self._unanswered:
                    self._cond.wait()
                    continue
                left = max(self._waiting_since, self._clock) + self._timeout - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self.timed_out = True
                call = self._call
                break
            else:
                return
        assert call is not None  # set by open(), which starts this thread
        call.cancel()


def _give_up(error: Exception, failed: BaseException | None) -> NoReturn:
    """End a put_stream that leaves writes unanswered with ``error``, and ``failed`` (what ``puts``
    raised, if it did) as its cause; but a SystemExit or KeyboardInterrupt from ``puts`` goes on as
    itself (``error`` its cause), so that ``except Exception`` does not stop it."""
    if failed is None:
        raise error
    if not isinstance(failed, Exception):
        raise failed from error
    raise error from failed


class _Unknown(NamedTuple):
    """What a call closed under its client leaves unknown: said in the error, and kept on it."""

    text: str
    request_id: str | None = None
    unanswered: Sequence[service_pb2.PutRequest] = ()


def _close_within(close: Callable[[], object], seconds: float) -> None:
    """Run a sync channel's ``close``, waiting for it ``seconds`` at most; past that it ends in the background.

    gRPC's close cancels the channel's calls and then waits until each has ended. A
    PutStream whose sidecar froze mid-stream (SIGSTOP, its socket full) stayed under
    way after the cancel, and close() waited until the sidecar ran again: for ever,
    had it never. The caller gets control back; the channel is freed when gRPC is done.
    """
    closing = threading.Thread(target=close, name="ckpt-client-close", daemon=True)
    closing.start()
    closing.join(seconds)
    if closing.is_alive():
        _warn_not_closed(seconds)


def _warn_not_closed(seconds: float) -> None:
    log.warning(
        "the gRPC channel had not closed after %.1f s (timeout_seconds): a call is still under way in"
        " gRPC (is the sidecar stopped or hung?); it goes on closing in the background",
        seconds,
    )


def _closed_during(client: object, unknown: _Unknown | None) -> ClientClosedError:
    """What a call gets when its client is closed under it (misuse: ValueError, as for a call after close())."""
    message = f"this {type(client).__name__} was closed during the call"
    if unknown is None:
        return ClientClosedError(message)
    return ClientClosedError(f"{message}; {unknown.text}", request_id=unknown.request_id, unanswered=unknown.unanswered)


def _unknown_write(request_id: str | None) -> _Unknown | None:
    if not request_id:
        return None
    return _Unknown(f"the write's outcome is unknown: resend it with request_id {request_id!r}", request_id)


def _unknown_stream(answered: int, unanswered: Sequence[service_pb2.PutStreamRequest]) -> _Unknown:
    writes = _writes_of(unanswered)
    return _Unknown(_progress(answered, writes), writes[0].request_id if writes else None, writes)


class CheckpointClient:
    """Synchronous client. Thread-safe; one per process is enough.

    Clients of one process to the same target share one connection, unless
    ``own_connection=True``: each connection is served by one worker of a
    ``ckpt serve --workers N``, so a process putting many threads' writes
    through one sidecar spreads them over its workers with a few clients of
    their own connections.

    ``timeout_seconds`` bounds each call, its retries included. Put, merge,
    get and the listings retry UNAVAILABLE up to ``retries`` times (writes
    resend the same request id, so a write lands once); fork and delete are
    not retried (a resent fork whose reply was lost would fail with
    ALREADY_EXISTS). ``put_stream`` reopens a broken stream and resends its
    unanswered writes (see there); ``timeout_seconds`` bounds each wait for
    one of its answers, not the stream.

    ``tls``: for a host:port target served with ``ckpt serve --tls-cert-file``,
    a :class:`ClientTLS` (the CA to trust; this client's certificate when the
    sidecar requires one), or True to trust the system's CAs. Unix sockets are
    always plaintext.
    """

    def __init__(
        self,
        target: str,
        *,
        timeout_seconds: float = 30.0,
        retries: int = DEFAULT_RETRIES,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        own_connection: bool = False,
        tls: ClientTLS | bool = False,
    ) -> None:
        _str("target", target)
        _client_options(timeout_seconds, retries, max_message_bytes)
        options = _options(max_message_bytes, own_connection=own_connection)
        self._channel = open_channel(target, _tls_of(target, tls), options, aio=False)
        self._stub = service_pb2_grpc.CheckpointServiceStub(self._channel)
        self._timeout = float(timeout_seconds)
        self._max_message_bytes = max_message_bytes
        self._retries = retries
        self._closed = False
        # The read-ahead of each put_stream under way: close() ends them, so that
        # one waiting for ``puts`` to give its next write is let go.
        self._readers: set[_ReadAhead] = set()
        self._readers_lock = threading.Lock()

    @classmethod
    def from_env(cls, **options: Any) -> CheckpointClient:
        """A client set up as the ``ckpt`` command line is, from the environment.

        ``CKPT_TARGET`` (required unless ``target=`` is given), ``CKPT_MAX_MESSAGE_BYTES``,
        and for TLS ``CKPT_TLS_CA_FILE``, ``CKPT_TLS_CLIENT_CERT_FILE``,
        ``CKPT_TLS_CLIENT_KEY_FILE``, ``CKPT_TLS_SERVER_NAME`` (see :class:`ClientTLS`).
        ``options`` are this class's keyword arguments, and win over the environment.
        Raises ValueError naming the variable that is missing or wrong.
        """
        return cls(**_from_environment(os.environ, options))

    def close(self) -> None:
        """Close the channel (idempotent); calls after it raise ValueError.

        Waits at most ``timeout_seconds`` for gRPC to end the channel's calls (see _close_within).
        """
        self._closed = True
        _close_within(self._channel.close, self._timeout)
        with self._readers_lock:
            readers = list(self._readers)
        for reader in readers:
            reader.close()

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
                if self._closed:  # close() cancelled it
                    raise _closed_during(self, _unknown_write(request_id)) from None
                delay = attempts.delay_or_raise(exc)
            except ValueError:
                if self._closed:  # gRPC's "Cannot invoke RPC on closed channel!": close() came first
                    raise _closed_during(self, _unknown_write(request_id)) from None
                raise
            time.sleep(delay)
            if self._closed:
                raise _closed_during(self, _unknown_write(request_id))

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
        self,
        *,
        labels: Mapping[str, str] | None = None,
        updated_after: datetime.datetime | None = None,
        updated_before: datetime.datetime | None = None,
        page_size: int = 100,
    ) -> Iterator[service_pb2.SessionInfo]:
        """Every session carrying all of ``labels`` and last written at or after
        ``updated_after`` and before ``updated_before`` (aware datetimes), if given;
        pages fetched as needed."""
        request = _sessions_request(labels, page_size, updated_after, updated_before)
        return self._pages(self._stub.ListSessions, request, "sessions")

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
        ``max_message_bytes``, or when no further write of ``puts`` is ready
        yet: a write is sent at once, not held for others to join it (an
        iterator is read on a thread of its own; a list is batched whole). A
        failed write is a PutResult with ``error`` set; the others go on.
        ``puts`` is read as the stream goes; if reading it raises (or it
        gives something that is not a PutRequest), every
        write it gave before is sent and answered, then that exception is
        raised (unless the stream gives up on those writes first: then its
        error is, with that exception as its cause). A write without a
        request id is sent with a new one.

        The stream outlasts sidecar restarts: when it breaks with a status the
        unary writes retry (UNAVAILABLE, CANCELLED), a new stream is opened
        after the same backoff and every write sent but not answered is sent
        again, in order, with the same request id, then the rest of ``puts``
        (so are the writes a stopping sidecar answered UNAVAILABLE without
        queuing them, the last of their batch: they were not written).
        Each write still yields exactly one result, in order; one the sidecar
        had committed before the break comes back with ``replayed=True``.
        ``retries`` bounds the reconnects of one run of failures (a stream
        that gets an answer starts the count afresh) and so does
        ``timeout_seconds`` from the failure; a stream broken while idle is
        reopened when ``puts`` gives its next write. Only the writes in
        flight are kept for this, not ``puts``. Giving up raises the error
        (UnavailableError after a restart that outlasted the retries) with
        the number of writes answered in its message and, as ``unanswered``,
        the writes sent without a result (perhaps committed), in order, with
        the request ids they were sent with (``request_id``: the first's):
        resend them as they are, then ``puts`` from index answered +
        len(unanswered) on, and each write lands once. Writes sent when
        iteration stops early may be committed too; none gets a result.
        ``timeout_seconds`` also bounds each wait for an answer while writes
        are in flight (counted from the wait's start or the last answer,
        whichever is later): past it the stream is cancelled and
        DeadlineExceededError raised, likewise naming the progress. Other
        statuses end the stream at once, as before, naming the progress too.
        """
        _puts_arg(puts, aio=False)
        _int("batch_size", batch_size, low=1, high=MAX_STREAM_BATCH_PUTS)  # the sidecar's limit
        self._check_open()
        return self._put_stream(puts, batch_size)

    def _put_stream(self, puts: Iterable[service_pb2.PutRequest], batch_size: int) -> Iterator[service_pb2.PutResult]:
        # Every write of a list is ready at once; an iterator's may come one by one (an
        # agent's steps), so it is read ahead, two messages' worth, to see when none is.
        reader = None
        if not isinstance(puts, Sequence):
            puts = reader = _ReadAhead(puts, depth=2 * batch_size, max_bytes=self._max_message_bytes)
            with self._readers_lock:
                self._readers.add(reader)
            if self._closed:  # close() came between the check in put_stream and here
                reader.close()
        feed = _StreamFeed(_stream_batches(puts, batch_size, self._max_message_bytes), self._timeout)
        attempts = _StreamAttempts(self._timeout, self._retries)
        try:
            while True:
                self._check_open()
                error: grpc.RpcError | None = None
                try:
                    for results in feed.answers(feed.open(self._stub.PutStream)):
                        attempts.progress()
                        yield from results
                except grpc.RpcError as exc:
                    error = exc
                feed.stop()
                if error is not None and feed.timed_out:  # the watchdog cancelled it (not a stream that just ended)
                    overdue = _with_progress(
                        _stream_deadline_error(self._timeout), feed.answered, feed.unanswered_batches()
                    )
                    _give_up(overdue, feed.failed)
                if self._closed and error is not None:  # close() ended the stream (idle or not)
                    _give_up(
                        _closed_during(self, _unknown_stream(feed.answered, feed.unanswered_batches())), feed.failed
                    )
                if feed.first_unanswered() is None and error is not None and attempts.would_retry(error):
                    feed.wait_for_write()  # broken while idle: reopen once there is a write to send
                    if self._closed:  # close() ended the wait; a write read meanwhile was not sent
                        _give_up(_closed_during(self, _unknown_stream(feed.answered, ())), feed.failed)
                unanswered = feed.unanswered_batches()
                if not unanswered and feed.done:
                    if feed.failed is not None:
                        raise feed.failed
                    return
                if error is None:
                    _give_up(_with_progress(_unanswered_at_end_error(), feed.answered, unanswered), feed.failed)
                if self._closed:  # close() ended the stream
                    _give_up(_closed_during(self, _unknown_stream(feed.answered, unanswered)), feed.failed)
                try:
                    delay = attempts.delay_or_raise(error)
                except CheckpointError as exc:
                    _give_up(_with_progress(exc, feed.answered, unanswered), feed.failed)
                time.sleep(delay)
                if self._closed:
                    _give_up(_closed_during(self, _unknown_stream(feed.answered, unanswered)), feed.failed)
        finally:
            feed.close()
            if reader is not None:
                reader.close()
                with self._readers_lock:
                    self._readers.discard(reader)


class AsyncCheckpointClient:
    """asyncio client with the same methods, arguments, errors and retries as CheckpointClient (awaitable).

    A write the caller cancels (``asyncio.timeout``, ``wait_for``, a TaskGroup)
    raises CancelledError, not an error carrying its request id, and the sidecar
    commits it anyway once queued: pass your own ``request_id`` to writes that
    may be cancelled, so that resending one cannot write twice.

    A client belongs to the event loop it is created in (RuntimeError
    otherwise, naming the mistake): create it in async code, one per loop.
    """

    def __init__(
        self,
        target: str,
        *,
        timeout_seconds: float = 30.0,
        retries: int = DEFAULT_RETRIES,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        own_connection: bool = False,
        tls: ClientTLS | bool = False,
    ) -> None:
        _str("target", target)
        _client_options(timeout_seconds, retries, max_message_bytes)
        tls_config = _tls_of(target, tls)
        # grpc.aio binds a channel to the loop it is made on; used from another,
        # every call failed with asyncio's "attached to a different loop".
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "AsyncCheckpointClient must be created in the event loop that uses it (in async code, such as the"
                " coroutine asyncio.run runs); outside async code, use CheckpointClient"
            ) from None
        options = _options(max_message_bytes, own_connection=own_connection)
        self._channel = open_channel(target, tls_config, options, aio=True)
        self._stub = service_pb2_grpc.CheckpointServiceStub(self._channel)
        self._timeout = float(timeout_seconds)
        self._max_message_bytes = max_message_bytes
        self._retries = retries
        self._closed = False
        self._closing: asyncio.Future[None] | None = None

    @classmethod
    def from_env(cls, **options: Any) -> AsyncCheckpointClient:
        """As CheckpointClient.from_env (in async code, as the constructor)."""
        return cls(**_from_environment(os.environ, options))

    async def close(self) -> None:
        """Close the channel (idempotent); calls after it raise ValueError.

        Waits at most ``timeout_seconds`` for gRPC to end the channel's calls (see _close_within).
        """
        self._closed = True
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._channel.close())  # kept: the loop holds tasks weakly
        done, _ = await asyncio.wait({self._closing}, timeout=self._timeout)
        if done:
            self._closing.result()
        else:
            _warn_not_closed(self._timeout)

    async def __aenter__(self) -> AsyncCheckpointClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"this {type(self).__name__} is closed")
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not self._loop:
            raise RuntimeError(
                f"this {type(self).__name__} belongs to the event loop it was created in, not this one"
                " (a client kept from one asyncio.run to the next?): create one in each loop"
            )

    async def _unary(self, method: Any, request: Any, *, retry: bool, request_id: str | None = None) -> Any:
        self._check_open()
        attempts = _Attempts(self._timeout, self._retries, retry, request_id)
        while True:
            try:
                return await method(request, timeout=attempts.remaining())
            except grpc.RpcError as exc:
                if self._closed:  # close() cancelled it
                    raise _closed_during(self, _unknown_write(request_id)) from None
                delay = attempts.delay_or_raise(exc)
            except asyncio.CancelledError:
                self._raise_if_closed_under(_unknown_write(request_id))
                raise
            await asyncio.sleep(delay)
            if self._closed:
                raise _closed_during(self, _unknown_write(request_id))

    def _raise_if_closed_under(self, unknown: _Unknown | None) -> None:
        """After a CancelledError: ValueError if close() cancelled the call (grpc-aio may cancel a
        closing channel's calls so), as the sync client's calls get; nothing if the caller's task was."""
        task = asyncio.current_task()
        if self._closed and (task is None or not task.cancelling()):
            raise _closed_during(self, unknown) from None

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
        self,
        *,
        labels: Mapping[str, str] | None = None,
        updated_after: datetime.datetime | None = None,
        updated_before: datetime.datetime | None = None,
        page_size: int = 100,
    ) -> AsyncIterator[service_pb2.SessionInfo]:
        """Every session carrying all of ``labels`` and last written at or after
        ``updated_after`` and before ``updated_before`` (aware datetimes), if given;
        pages fetched as needed."""
        request = _sessions_request(labels, page_size, updated_after, updated_before)
        return self._pages(self._stub.ListSessions, request, "sessions")

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
        self,
        puts: Iterable[service_pb2.PutRequest] | AsyncIterable[service_pb2.PutRequest],
        *,
        batch_size: int = 64,
    ) -> AsyncIterator[service_pb2.PutResult]:
        """As CheckpointClient.put_stream (reopened after a break the same way), except that ``puts`` (an
        iterable or an async iterable) is read whole before anything is sent (so an exception reading it is
        raised before any write)."""
        _puts_arg(puts, aio=True)
        _int("batch_size", batch_size, low=1, high=MAX_STREAM_BATCH_PUTS)  # the sidecar's limit
        self._check_open()
        return self._put_stream(puts, batch_size)

    async def _put_stream(
        self, puts: Iterable[service_pb2.PutRequest] | AsyncIterable[service_pb2.PutRequest], batch_size: int
    ) -> AsyncIterator[service_pb2.PutResult]:
        if isinstance(puts, AsyncIterable):  # read whole too: copies, as they may be refilled and given again
            puts = [_copied(put) async for put in puts]
            if self._closed:  # close() came while puts was read: closed under the call, which sent nothing
                raise _closed_during(self, _unknown_stream(0, ()))
        batches = list(_stream_batches(puts, batch_size, self._max_message_bytes))
        first = 0  # the first batch not answered; each stream sends batches[first:]
        answered = 0  # writes
        held: list[service_pb2.PutResult] = []  # see _split_answer
        attempts = _StreamAttempts(self._timeout, self._retries)
        while True:
            self._check_open()
            call = self._stub.PutStream(itertools.islice(batches, first, None))
            answers = _AnswerWait(call, self._timeout)  # each answer's bound, not the stream's
            error: grpc.RpcError | None = None
            try:
                while True:
                    try:
                        response = await answers.read()
                    except TimeoutError:
                        raise _with_progress(_stream_deadline_error(self._timeout), answered, batches[first:]) from None
                    except asyncio.CancelledError:
                        self._raise_if_closed_under(_unknown_stream(answered, batches[first:]))
                        raise
                    out, held = held, []
                    if out:  # given after all: their batch is answered
                        first += 1
                        answered += len(out)
                    if response is not grpc.aio.EOF:
                        now, held, rest = _split_answer(response, batches[first] if first < len(batches) else None)
                        if rest is None:
                            first += 1
                        else:
                            batches[first] = rest
                        answered += len(now)
                        out += now
                    if out:
                        attempts.progress()
                    for result in out:
                        yield result
                    if response is grpc.aio.EOF or (first == len(batches) and not held):
                        # Every write answered: the stream's end is not waited for (nor bounded by
                        # timeout_seconds, which is for answers); leaving cancels it.
                        break
            except grpc.RpcError as exc:
                error = exc
                held = []  # their writes stay unanswered: resent, or named if the stream gives up
            finally:
                call.cancel()  # a no-op once it has ended
            if first == len(batches):
                return
            if error is None:
                raise _with_progress(_unanswered_at_end_error(), answered, batches[first:])
            if self._closed:  # close() ended the stream
                raise _closed_during(self, _unknown_stream(answered, batches[first:]))
            try:
                delay = attempts.delay_or_raise(error)
            except CheckpointError as exc:
                _with_progress(exc, answered, batches[first:])
                raise
            await asyncio.sleep(delay)
            if self._closed:
                raise _closed_during(self, _unknown_stream(answered, batches[first:]))
