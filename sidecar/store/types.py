"""The store's public types: what a write asks and gets back, what a read and a listing return."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import FrozenInstanceError, dataclass, field

from ckpt.store.v1 import records_pb2

from ...codec import FrameKind


class WriteMode(enum.IntEnum):
    REPLACE = 1
    MERGE = 2
    FORK = 3  # version 1 of a forked session


@dataclass(frozen=True, slots=True)
class PutResult:
    version: int
    stored_bytes: int
    frame_kind: FrameKind
    state_size: int
    replayed: bool = False
    #: Frames after the chain's FULL frame, this one included (0 for a FULL frame; a replay's: the recorded one,
    #: 0 if its record predates keeping it).
    chain_depth: int = 0
    #: XXH3-64 of the state written (a replay's: the recorded one, 0 if its record predates keeping it).
    state_xxh3: int = 0


@dataclass(frozen=True, slots=True)
class VersionInfo:
    version: int
    parent_version: int
    created_unix_nanos: int
    frame_kind: FrameKind
    stored_bytes: int
    state_size: int
    labels: dict[str, str]
    mode: WriteMode
    #: The message type the version's state holds (registry.py); "" for opaque bytes.
    message_type: str = ""
    #: XXH3-64 of the version's state, as its frame header records it (a write's expected_state_xxh3).
    state_xxh3: int = 0
    #: XXH3-64 the state had as written, if a fold stored it compacted since (equal as a message, other
    #: bytes); 0 if it did not. A caller holding the state as written holds this version's state.
    written_state_xxh3: int = 0

    def has_state(self, state_xxh3: int) -> bool:
        """Whether a state of that XXH3-64 is this version's: its state as stored, or as written before a
        fold compacted it (the same message). A caller holding it need not read the state."""
        return state_xxh3 in (self.state_xxh3, self.written_state_xxh3 or None)


class GetResult:
    """A version's state, verified, and what its stored value says of it (:attr:`info`).

    Immutable, as the other results. A read from storage parses ``info`` from
    the version's stored metadata only when it is first asked for: a cold read
    that wants the state alone (an agent resuming) skips it, a tenth of that
    read. Damaged metadata is then DataLoss from ``info``, naming the version;
    the state and its version were checked by the read.
    """

    __slots__ = ("_info", "_read_info", "state", "version")

    version: int
    state: bytes
    _info: VersionInfo | None
    _read_info: Callable[[], VersionInfo] | None

    def __init__(
        self,
        version: int,
        state: bytes,
        info: VersionInfo | None = None,
        *,
        read_info: Callable[[], VersionInfo] | None = None,
    ) -> None:
        if (info is None) == (read_info is None):
            raise TypeError("GetResult takes info or read_info, one of them")
        # Slot setters: object.__setattr__ per field would cost what the lazy info saves.
        _set_version(self, version)
        _set_state(self, state)
        _set_info(self, info)
        _set_read_info(self, read_info)

    @property
    def info(self) -> VersionInfo:
        info: VersionInfo | None = self._info
        if info is None:
            assert self._read_info is not None  # set whenever _info is not
            info = self._read_info()
            _set_info(self, info)
            _set_read_info(self, None)
        return info

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GetResult):
            return NotImplemented
        return (self.version, self.state, self.info) == (other.version, other.state, other.info)

    __hash__ = None  # type: ignore[assignment]  # as the dataclass's: its VersionInfo's labels are a dict

    def __repr__(self) -> str:
        return f"GetResult(version={self.version!r}, state={self.state!r}, info={self.info!r})"


_slots = GetResult.__dict__
_set_version, _set_state = _slots["version"].__set__, _slots["state"].__set__
_set_info, _set_read_info = _slots["_info"].__set__, _slots["_read_info"].__set__


@dataclass(frozen=True, slots=True)
class SessionInfo:
    session_id: str
    head_version: int
    first_version: int
    created_unix_nanos: int
    updated_unix_nanos: int
    labels: dict[str, str]
    stored_bytes: int
    version_count: int
    forked_from_session_id: str
    forked_from_version: int
    #: The version whose FULL frame starts the head's chain: where a cold read of the head decodes from.
    chain_start_version: int = 0
    #: The session's message type; "" if untyped.
    message_type: str = ""


@dataclass(frozen=True, slots=True)
class PutRequest:
    """One write, as Store.put_many takes them."""

    session_id: str
    state: bytes
    mode: WriteMode = WriteMode.REPLACE
    expected_version: int | None = None
    request_id: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    #: The message type ``state`` holds (a registered or built-in full name); "": the session's, if typed.
    message_type: str = ""
    #: Compare-and-set on the head's content: write only if the head state has this XXH3-64 (None: unchecked).
    expected_state_xxh3: int | None = None


@dataclass(frozen=True, slots=True)
class SweepResult:
    sessions_pruned: int
    versions_removed: int
    request_ids_expired: int
    #: Quiet sessions whose head frame became a FULL frame (keyframe_after_quiet_seconds).
    keyframes_written: int = 0
    #: Events retention removed (keep_last_events, max_event_age_seconds).
    events_removed: int = 0
    #: Quiet sessions whose head run was folded: a FULL head, PREFIX frames before it (fold_after_quiet_seconds).
    heads_folded: int = 0
    #: Blob references retention dropped: named by no version kept, or of a session without a checkpoint.
    blob_refs_released: int = 0

    @property
    def changed(self) -> bool:
        """Whether the sweep removed or rewrote anything (an idle store's sweeps do not)."""
        return bool(
            self.versions_removed
            or self.request_ids_expired
            or self.keyframes_written
            or self.events_removed
            or self.heads_folded
            or self.blob_refs_released
        )

    def __add__(self, other: SweepResult) -> SweepResult:
        return SweepResult(
            self.sessions_pruned + other.sessions_pruned,
            self.versions_removed + other.versions_removed,
            self.request_ids_expired + other.request_ids_expired,
            self.keyframes_written + other.keyframes_written,
            self.events_removed + other.events_removed,
            self.heads_folded + other.heads_folded,
            self.blob_refs_released + other.blob_refs_released,
        )


#: A MERGE patch this big or bigger is checked on a thread, not the event loop (Store.asubmit).
#: Below it the check takes at most ~10 ms here; a thread costs ~0.1 ms either way.
OFF_LOOP_PATCH_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class NewEvent:
    """One event to append (Store.append_events): its seq is the log's next; its time, if None, the commit's."""

    type: str
    payload: bytes = b""
    attributes: dict[str, str] = field(default_factory=dict)
    #: When it happened, in nanoseconds since the Unix epoch; None: the commit's time.
    time_unix_nanos: int | None = None


@dataclass(frozen=True, slots=True)
class AppendResult:
    """What an append made: the seqs of its events (0, 0 when it had none), its put's result if it had one."""

    first_seq: int
    last_seq: int
    put: PutResult | None = None
    #: A retry of an earlier append with the same request id: nothing new was appended.
    replayed: bool = False
    #: The log's last seq once the append committed (0: the log has no event), whether or not it appended:
    #: where a put alone tells its caller the log is, without appending to learn it.
    log_last_seq: int = 0


@dataclass(frozen=True, slots=True)
class EventQuery:
    """Which events a read asks for (Store.read_events); times are exclusive bounds in nanoseconds."""

    after_seq: int = 0
    types: tuple[str, ...] = ()
    after_unix_nanos: int | None = None
    before_unix_nanos: int | None = None
    newest_first: bool = False
    page_size: int = 0
    page_token: str = ""


@dataclass(frozen=True, slots=True)
class ReadBound:
    """How much one read of events may do (Store.read_events' ``bound``); past any of these, ResourceExhausted
    and no page: for a caller that must not be held long, such as an event loop other calls wait on."""

    #: Blocks visited: decompressed, or skipped by their header's times.
    max_blocks: int
    #: The blocks' event bytes before compression (a block's header says it before it is decompressed).
    max_raw_bytes: int
    #: Events on the page.
    max_events: int


@dataclass(frozen=True, slots=True)
class EventPage:
    """A page of a session's events, the token of the next page ("" after the last), and when the log read
    was created (0: the session has no event log): a log deleted and written again has another time.

    The events are ckpt.store.v1.StoredEvent messages, whose fields are ckpt.v1.Event's (seq and time set).
    """

    events: list[records_pb2.StoredEvent]
    next_page_token: str
    log_created_unix_nanos: int = 0
