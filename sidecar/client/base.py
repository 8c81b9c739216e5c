"""What the two clients share: every public method, its arguments, requests and meaning, written once.

CheckpointClient and AsyncCheckpointClient differ only in their I/O: how a
unary call is made and retried, how pages are fetched, how a put_stream's
streams are driven, and how the channel is closed. Those are this class's
hooks; the type parameters are what each method returns in each client (a
response, or an awaitable of one; an iterator, or an async one).
"""

from __future__ import annotations

import abc
import datetime
import functools
import operator
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, NoReturn, Self, TypeVar, cast

import grpc
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from ckpt.v1 import service_pb2, service_pb2_grpc

from ..limits import DEFAULT_MAX_MESSAGE_BYTES
from ..tls import ClientTLS, open_channel
from .arguments import (
    check_client_options,
    check_put_stream,
    check_str,
    delete_request,
    fork_request,
    get_request,
    history_request,
    put_request,
    register_request,
    sessions_request,
)
from .channel import channel_options, check_target_port, from_environment, in_variable_terms, tls_of
from .errors import DataLossError, Unknown, closed_during, translate, unknown_write
from .eventfilter import EventFilter
from .ledger import StreamLimits
from .policy import DEFAULT_RETRIES, Attempts, BlobReadAttempts
from .putbytes import put_call_bytes
from .stream import StreamRun

PutT = TypeVar("PutT")
GetT = TypeVar("GetT")
ForkT = TypeVar("ForkT")
CountT = TypeVar("CountT")
VersionsT = TypeVar("VersionsT")
SessionsT = TypeVar("SessionsT")
_SERVICE_NAME = service_pb2.DESCRIPTOR.services_by_name["CheckpointService"].full_name
PutsT = TypeVar("PutsT")
ResultsT = TypeVar("ResultsT")
TypesT = TypeVar("TypesT")


def _message_types(response: service_pb2.RegisterTypeResponse) -> list[str]:
    return list(response.message_types)


@dataclass(frozen=True)
class Unary:
    """One unary call: the stub's method, its request (built when the call starts, so that an async
    call refuses bad arguments when awaited), whether it is retried, and what of its response is returned.
    A write's request id goes on its errors."""

    method: str
    build: Callable[[], Any]
    retry: bool
    writes: bool = False
    pick: Callable[[Any], Any] | None = None

    def start(self, client: ClientBase[Any, Any, Any, Any, Any, Any, Any, Any, Any]) -> tuple[Any, Any, Attempts]:
        """The stub's method, the request, and the call's attempts (refused if the client is closed)."""
        request = self.build()
        client._check_open()
        request_id = request.request_id if self.writes else None
        attempts = Attempts(client._timeout, client._retries, self.retry, request_id, target=client._target)
        return getattr(client._stub, self.method), request, attempts

    def result(self, response: Any) -> Any:
        return response if self.pick is None else self.pick(response)


def method_path(method: str) -> str:
    """A CheckpointService method's path, as the generated stub calls it (``/ckpt.v1.CheckpointService/Put``)."""
    return f"/{_SERVICE_NAME}/{method}"


def checkpoint_stub(channel: Any) -> Any:
    """The generated CheckpointService stub on ``channel`` (sync or grpc.aio), its Put sending a PutCall
    (putbytes.py: the state joined into the request, not serialized by protobuf)."""
    stub = service_pb2_grpc.CheckpointServiceStub(channel)
    stub.Put = channel.unary_unary(
        method_path("Put"),
        request_serializer=put_call_bytes,
        response_deserializer=service_pb2.PutResponse.FromString,
        _registered_method=True,  # as the generated stub registers its methods
    )
    return stub


class ClientBase(abc.ABC, Generic[PutT, GetT, ForkT, CountT, VersionsT, SessionsT, PutsT, ResultsT, TypesT]):
    _AIO: ClassVar[bool]

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
        check_str("target", target)
        check_target_port(target)
        check_client_options(timeout_seconds, retries, max_message_bytes)
        tls_config = tls_of(target, tls)
        self._bind()
        options = channel_options(max_message_bytes, own_connection=own_connection)
        self._channel = open_channel(target, tls_config, options, aio=self._AIO)
        self._stub = checkpoint_stub(self._channel)
        self._target = target
        self._timeout = float(timeout_seconds)
        self._max_message_bytes = max_message_bytes
        self._retries = retries
        self._closed = False
        # The put_streams under way: close() stops their reading of ``puts``, so
        # that one waiting for its next write is let go.
        self._streams: set[Any] = set()
        self._streams_lock = threading.Lock()

    @classmethod
    def from_env(cls, **options: Any) -> Self:
        """A client set up as the ``ckpt`` command line is, from the environment (an async one in async code).

        ``CKPT_TARGET`` (required unless ``target=`` is given), ``CKPT_MAX_MESSAGE_BYTES``,
        and for TLS ``CKPT_TLS_CA_FILE``, ``CKPT_TLS_CLIENT_CERT_FILE``,
        ``CKPT_TLS_CLIENT_KEY_FILE``, ``CKPT_TLS_SERVER_NAME`` (see :class:`ClientTLS`).
        ``options`` are this class's keyword arguments, and win over the environment.
        Raises ValueError naming the variable that is missing or wrong.
        """
        arguments = from_environment(os.environ, options)
        try:
            return cls(**arguments)
        except ValueError as exc:  # e.g. "CKPT_MAX_MESSAGE_BYTES must be >= 1024, got 5"
            raise ValueError(in_variable_terms(str(exc), arguments.keys() - options.keys())) from None

    def put(
        self,
        session_id: str,
        state: bytes | None = None,
        *,
        message: Message | None = None,
        message_type: str | None = None,
        expected_version: int | None = None,
        request_id: str | None = None,
        labels: Mapping[str, str] | None = None,
        expected_state_xxh3: int | None = None,
    ) -> PutT:
        """Write the whole new state (REPLACE): ``state`` bytes, or ``message``, a protobuf message sent
        serialized with its type's name (register the type first: :meth:`register_type`). ``message_type``
        names the type of ``state`` bytes. A typed state reads back byte for byte.

        ``expected_version``, ``expected_state_xxh3``: compare-and-set; write only if the head is that
        version, and if its state has that XXH3-64 (the ``state_xxh3`` of the PutResponse that wrote it,
        or of a Get's ``info``): ConflictError otherwise, nothing written. Only the second tells the head
        you hold from another state at the same version (the session deleted and written again). The
        reply's ``state_xxh3`` is the new head's, to pass to the next write."""
        mode = service_pb2.WRITE_MODE_REPLACE
        return self._write(
            session_id, state, mode, expected_version, request_id, labels, message, message_type, expected_state_xxh3
        )

    def merge(
        self,
        session_id: str,
        patch: bytes | None = None,
        *,
        message: Message | None = None,
        message_type: str | None = None,
        expected_version: int | None = None,
        request_id: str | None = None,
        labels: Mapping[str, str] | None = None,
        expected_state_xxh3: int | None = None,
    ) -> PutT:
        """Write a partial message merged onto the latest state (MERGE): ``patch`` bytes, or ``message``, a
        protobuf message holding only what changed, sent with its type's name. A typed session's state
        reads back equal as a message to every patch merged, not byte for byte (it is compacted).
        ``expected_version``, ``expected_state_xxh3``: as :meth:`put`'s; a read-modify-merge that must land
        on the state it read passes that state's ``state_xxh3``."""
        mode = service_pb2.WRITE_MODE_MERGE
        return self._write(
            session_id, patch, mode, expected_version, request_id, labels, message, message_type, expected_state_xxh3
        )

    def _write(
        self,
        session_id: str,
        data: bytes | None,
        mode: int,
        expected_version: int | None,
        request_id: str | None,
        labels: Mapping[str, str] | None,
        message: Message | None,
        message_type: str | None,
        expected_state_xxh3: int | None,
    ) -> PutT:
        # The request (and so its request id) is built once: retries resend it unchanged.
        build = functools.partial(
            put_request,
            session_id,
            data,
            mode,
            expected_version,
            request_id,
            labels,
            message,
            message_type,
            expected_state_xxh3,
        )
        return cast(PutT, self._unary(Unary("Put", build, retry=True, writes=True)))

    def register_type(self, message: type[Message] | Message | Descriptor | bytes) -> TypesT:
        """Register a message type with the sidecar, so that writes of it are typed; the full names of the
        message types registered (nested ones too).

        ``message``: a message class (or a message, or its Descriptor): its .proto file and every file
        that file imports are sent, as a FileDescriptorSet; or such a set's bytes (``protoc
        --descriptor_set_out``). Registering again is harmless; a changed file replaces the old one if the
        change is compatible (FailedPreconditionError otherwise).
        """
        build = functools.partial(register_request, message)
        pick = _message_types
        return cast(TypesT, self._unary(Unary("RegisterType", build, retry=True, pick=pick)))

    def get(
        self,
        session_id: str,
        version: int = 0,
        *,
        field_mask: Sequence[str] = (),
        events: EventFilter | None = None,
        known_state_xxh3: int | None = None,
    ) -> GetT:
        """Read a version (0 = the latest). ``field_mask``: only these fields of a typed session's state
        (paths of field names, e.g. ``("handoff", "plan")``, ``"handoff.next"``), every other one cleared.

        ``events``: also the first page of the session's events this filter selects, in the same call
        (one round trip rather than a get and an ``events``): the reply's ``events.events``, and
        ``events.next_page_token``, empty unless the page was cut (pass it to :meth:`events` with the same
        filters for the rest). The page is cut where the state leaves no room in the reply, and is empty
        if its first event does not fit: :meth:`events` reads on from the token. For an agent resuming
        from its state and its newest events, say.

        ``known_state_xxh3``: the ``state_xxh3`` of a state the caller holds (a put's reply's, or an earlier
        get's ``info.state_xxh3``): if the version read has that state, the reply leaves it out
        (``state_omitted`` true, ``state`` empty, the rest as ever), so a caller that keeps the head it
        wrote learns it is still the head without the state sent again. Not with ``field_mask``."""
        read = events.request(session_id) if events is not None else None
        build = functools.partial(get_request, session_id, version, field_mask, read, known_state_xxh3)
        return cast(GetT, self._unary(Unary("Get", build, retry=True)))

    def history(
        self, session_id: str, *, page_size: int = 100, include_states: bool = False, start_version: int = 0
    ) -> VersionsT:
        """Every version of a session, newest first (pages fetched as needed), from ``start_version`` back
        (0: from the head).

        ``include_states``: each VersionInfo's ``state`` holds that version's state, what :meth:`get` of it
        returns, the sidecar decoding each delta chain once rather than once per version: a session's
        history in one call per page, not a Get per version. A page then also ends early rather than pass
        the sidecar's message limit; a single state over it is ResourceExhaustedError naming the version.
        """
        request = history_request(session_id, page_size, include_states, start_version)
        return cast(VersionsT, self._pages("ListVersions", request, "versions", join_state_suffixes))

    def sessions(
        self,
        *,
        labels: Mapping[str, str] | None = None,
        updated_after: datetime.datetime | Timestamp | None = None,
        updated_before: datetime.datetime | Timestamp | None = None,
        page_size: int = 100,
        prefix: str = "",
    ) -> SessionsT:
        """Every session carrying all of ``labels``, last written at or after ``updated_after`` and
        before ``updated_before`` (aware datetimes, or Timestamps to the nanosecond), and whose id starts
        with ``prefix``, if given; pages fetched as needed. A prefix alone reads only the sessions of the
        prefix (in session id order, those holding only events or blobs too), however many others the store holds."""
        request = sessions_request(labels, page_size, updated_after, updated_before, prefix)
        return cast(SessionsT, self._pages("ListSessions", request, "sessions"))

    def fork(
        self,
        session_id: str,
        new_session_id: str,
        *,
        version: int = 0,
        labels: Mapping[str, str] | None = None,
        copy_events: bool = False,
    ) -> ForkT:
        """Create ``new_session_id`` whose version 1 is ``version`` (0 = the latest) of ``session_id``
        (``copy_events``: with a copy of its event log, seqs and times as they are)."""
        build = functools.partial(fork_request, session_id, new_session_id, version, labels, copy_events)
        return cast(ForkT, self._unary(Unary("Fork", build, retry=False, pick=operator.attrgetter("session"))))

    def delete(self, session_id: str) -> CountT:
        """Remove a session, all its versions and its event log; returns how many versions were removed."""
        build = functools.partial(delete_request, session_id)
        pick = operator.attrgetter("deleted_versions")
        return cast(CountT, self._unary(Unary("DeleteSession", build, retry=False, pick=pick)))

    def put_stream(self, puts: PutsT, *, batch_size: int = 64) -> ResultsT:
        """Send many writes on one stream, ``batch_size`` per message; yield one result per write, in order.

        ``puts`` is an iterable of ckpt.v1.PutRequest (for AsyncCheckpointClient,
        an async iterable too), read as the stream goes, never whole first. A
        message holds fewer writes when ``batch_size`` of them would pass
        ``max_message_bytes``, or when no further write of ``puts`` is ready
        yet: a write is sent at once, not held for others to join it (an
        iterator is read a few writes ahead, on a thread or a task of its own; a
        sequence is batched whole). A failed write is a PutResult with ``error``
        set; the others go on. If reading ``puts`` raises (or it gives
        something that is not a PutRequest), every write it gave before is sent
        and answered, then that exception is raised (unless the stream gives up
        on those writes first: then its error is, with that exception as its
        cause). A write without a request id is sent with a new one (the
        caller's message is not changed).

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
        flight are kept for this, not ``puts``: at most 128 messages, or
        128 MiB of them, are sent ahead of their answers. Giving up raises the
        error (UnavailableError after a restart that outlasted the retries)
        with the number of writes answered in its message and, as
        ``unanswered``, the writes sent without a result (perhaps committed),
        in order, with the request ids they were sent with (``request_id``:
        the first's): resend them as they are, then ``puts`` from index
        answered + len(unanswered) on, and each write lands once. Writes sent
        when iteration stops early may be committed too; none gets a result.
        ``timeout_seconds`` also bounds each wait for an answer while writes
        are in flight (counted from the wait's start or the last answer,
        whichever is later): past it the stream is cancelled and
        DeadlineExceededError raised, likewise naming the progress. Other
        statuses end the stream at once, as before, naming the progress too.
        Once every write is answered and ``puts`` has ended, the stream's own
        end is not waited for.
        """
        limits = StreamLimits(
            batch_size=check_put_stream(puts, batch_size, aio=self._AIO), max_message_bytes=self._max_message_bytes
        )
        self._check_open()
        return cast(ResultsT, self._put_stream(puts, limits))

    # -- what the clients' I/O shares

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"this {type(self).__name__} is closed")

    def _retry_delay(self, error: grpc.RpcError, attempts: Attempts) -> float:
        """The wait before a failed call's next attempt (translating ``error`` if there is none)."""
        if self._closed:  # close() cancelled it
            raise self._closed_during(unknown_write(attempts.request_id)) from None
        return attempts.delay_or_raise(error)

    def _check_not_closed_during(self, attempts: Attempts) -> None:
        if self._closed:
            raise self._closed_during(unknown_write(attempts.request_id))

    def _closed_during(self, unknown: Unknown | None) -> ValueError:
        return closed_during(type(self).__name__, unknown)

    def _blob_failed(self, exc: grpc.RpcError) -> NoReturn:
        """A blob stream's error: ClientClosedError if close() ended it (a cut stream stores nothing, so
        nothing is unknown), else the status translated."""
        if self._closed:
            raise self._closed_during(None) from None
        translate(exc)

    def _blob_read_delay(self, exc: grpc.RpcError, attempts: BlobReadAttempts) -> float:
        """The wait before a failed GetBlob's next attempt (policy.BlobReadAttempts), else its error:
        ClientClosedError if close() ended it, else the status translated."""
        if self._closed:
            raise self._closed_during(None) from None
        return attempts.delay_or_raise(exc)

    def _check_not_closed_while_waiting(self) -> None:
        """After a GetBlob's wait: close() came meanwhile (a read leaves nothing unknown)."""
        if self._closed:
            raise self._closed_during(None)

    @staticmethod
    def _next_page(request: Any, page: Any) -> bool:
        """Whether there is a page after ``page``; if so, ``request`` now asks for it."""
        if not page.next_page_token:
            return False
        request.page_token = page.next_page_token
        return True

    def _stream_run(self, puts: Any, limits: StreamLimits) -> StreamRun:
        return StreamRun(
            limits=limits,
            owned=not isinstance(puts, Sequence),  # a sequence's writes are the caller's; a reader's, copies
            timeout_seconds=self._timeout,
            retries=self._retries,
            client_name=type(self).__name__,
            target=self._target,
        )

    def _streaming(self, feed: Any, *, under_way: bool) -> None:
        """Record a put_stream's feed as under way, or no longer."""
        with self._streams_lock:
            if under_way:
                self._streams.add(feed)
            else:
                self._streams.discard(feed)

    def _stop_reading(self) -> None:
        """Stop every put_stream's reading of ``puts`` (close()'s last step)."""
        with self._streams_lock:
            feeds = list(self._streams)
        for feed in feeds:
            feed.stop_reading()

    # -- each client's I/O

    @abc.abstractmethod
    def _bind(self) -> None:
        """Anything the client needs before its channel is opened."""

    @abc.abstractmethod
    def _unary(self, call: Unary) -> Any:
        """Make ``call``, retried by the policy: its result (or, async, an awaitable of it)."""

    @abc.abstractmethod
    def _pages(self, method: str, request: Any, field: str, finish: Callable[[Any], None] | None = None) -> Any:
        """The items of ``field`` of every page of a listing, fetched as needed; ``finish``, if given, called
        with each page before its items are given."""

    @abc.abstractmethod
    def _put_stream(self, puts: Any, limits: StreamLimits) -> Any:
        """The results of a put_stream, driving its StreamRun (see sync_stream and async_stream)."""


def join_state_suffixes(page: service_pb2.ListVersionsResponse) -> None:
    """Give each version of a ListVersions page its whole ``state``, where the sidecar sent it as the bytes
    after the next older entry's (``state_suffix``, ListVersionsRequest.states_as_suffixes): oldest first,
    as a Get returns it. DataLossError for a page the sidecar ended with a suffix, which no state precedes."""
    older: bytes | None = None
    for version in reversed(page.versions):
        if version.HasField("state_suffix"):
            if older is None:
                raise DataLossError(
                    f"ListVersions: version {version.version}, the oldest of its page, came as a"
                    f" {len(version.state_suffix)}-byte suffix of no state",
                    grpc.StatusCode.DATA_LOSS,
                )
            version.state = older + version.state_suffix
            version.ClearField("state_suffix")
        older = version.state
