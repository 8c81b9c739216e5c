"""Reading a session's head where the last head read is kept with its chain's live stream (the gRPC
process, replycache.py): the first read decodes the chain whole, a later one only the frames since.

A head read from its FULL frame costs its whole chain's decode (300-1000 us
for a LangGraph thread's 30-330 KB state); the frames written since the
head a ChainReader holds are a forward scan of the session's key range
from the version after it, and advancing the reader decodes only them.
Nothing here trusts the kept reader: a session deleted and written again,
a frame rewritten (a quiet keyframe, retention), another process's writes
all show as frames that do not link to it or a state whose xxh3 fails, and
advance_head answers None: the caller reads the head whole.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...codec import ChainReader, DecodeError, OutputTooLargeError, StateTooLargeError, open_chain
from ...codec.chainchecks import check_limit
from ..errors import DataLoss, InvalidArgument, StateTooLarge
from ..storage import ReadTxn
from . import keys
from .eventreads import check_query, read_events
from .prefixes import is_full_v2
from .reads import AFTER_SEP, chain_back, check_frame_version, check_version_arg, refuse_unstored, sealed_head
from .records import frame_of, version_info
from .stateevents import named_events_field, same_txn
from .types import EventPage, EventQuery, GetResult, ReadBound, VersionInfo

if TYPE_CHECKING:
    from .engine import Store

#: The most frames one advance reads: more since the version kept means a new chain (a chain without
#: segments holds at most the policy's max_depth, 64, frames after its FULL one), or a segmented MERGE
#: chain whose head is read through a few frames (codec FORMAT.md §14): either is decoded whole.
MAX_ADVANCE_FRAMES = 64


class HeadEvents:
    """A page of events to read with the head, in its read transaction (as Store.get_with_events does)."""

    __slots__ = ("bound", "max_page_bytes", "query")

    def __init__(self, query: EventQuery, *, max_page_bytes: int, bound: ReadBound | None) -> None:
        self.query, self.max_page_bytes, self.bound = query, max_page_bytes, bound

    def check(self) -> None:
        try:
            check_query(self.query)  # a bad filter is refused before any state is decoded
        except InvalidArgument as exc:
            raise named_events_field(exc) from None

    def page(self, txn: ReadTxn, store: Store, session_id: str, state_bytes: int) -> EventPage:
        """The page, in what ``max_page_bytes`` leaves beside a state of ``state_bytes`` (get_with_events)."""
        try:
            return read_events(
                same_txn(txn),
                store.tables,
                session_id,
                self.query,
                max_page_bytes=self.max_page_bytes,
                bound=self.bound,
                beside_bytes=state_bytes,
            )
        except InvalidArgument as exc:
            raise named_events_field(exc) from None


def read_head(
    store: Store,
    session_id: str,
    *,
    max_state_bytes: int | None = None,
    max_output_bytes: int | None = None,
    events: HeadEvents | None = None,
) -> tuple[GetResult, ChainReader | None, EventPage | None]:
    """``store.get(session_id, use_cache=False, max_state_bytes=...)`` (with ``events``: get_with_events),
    same errors, with a reader of the head's chain to pass to :func:`advance_head` later (None when its
    chain cannot be continued) and the page of ``events`` read in the same transaction.

    ``max_output_bytes`` bounds the decode's work: StateTooLarge, before anything is decompressed, if the
    head's chain outputs more (its FULL state, its patches and its DELTAs' states). ``max_state_bytes``
    bounds the head and every version the reader advances to."""
    sid = keys.session_key(session_id)
    if events is not None:
        events.check()
    page = None
    limit = check_limit(max_state_bytes)
    bound = min((b for b in (limit, check_limit(max_output_bytes, "max_output_bytes")) if b is not None), default=None)
    with store.read() as txn:
        # A quiet session's folded head (most cold reads) in one cursor step and one decode; its reader,
        # as open_chain makes one for a sealed FULL frame, holds no live stream.
        sealed = sealed_head(txn, store.tables.frames, sid, bound)
        if sealed is not None:
            target, value, latest = sealed
            check_frame_version(session_id, target, latest)
            reader: ChainReader | None = ChainReader(latest, None, limit)
        else:
            found = chain_back(txn, store.tables.frames, sid, session_id, 0)
            if found is None:  # no frame stored: the session record says why
                refuse_unstored(txn, store.tables, sid, session_id, 0)
            target, value, frames = found
            try:
                latest, reader = open_chain(frames, max_state_bytes=max_state_bytes, max_output_bytes=max_output_bytes)
            except (StateTooLargeError, OutputTooLargeError) as exc:
                raise StateTooLarge(f"session {session_id!r} version {target}: {exc}") from None
            except DecodeError as exc:
                raise DataLoss(f"session {session_id!r} version {target}: {exc}") from None
        info = version_info(session_id, target, value, header=latest.header)
        if events is not None:
            page = events.page(txn, store, session_id, len(latest.state))
    return GetResult(target, latest.state, info), reader, page


def advance_head(
    store: Store,
    session_id: str,
    reader: ChainReader,
    *,
    max_output_bytes: int | None = None,
    events: HeadEvents | None = None,
) -> tuple[GetResult, EventPage | None] | None:
    """The session's head read by advancing ``reader`` with the frames stored after its version, in one
    read transaction; None (``reader`` then spent or unchanged) if that is not how the head is reached:
    no frame after it, more than MAX_ADVANCE_FRAMES, a FULL frame among them, frames outputting more than
    ``max_output_bytes`` (their patches and their DELTAs' states), or any check advancing makes failing.
    The state is bounded by the ``max_state_bytes`` the reader was opened with; ``events``: a page read in
    the same transaction, as read_head reads it."""
    sid = keys.session_key(session_id)
    if events is not None:
        events.check()
    page = None
    prefix = sid + keys.SEP
    after = reader.version
    frames: list[memoryview] = []
    last_key = last_value = None
    with store.read() as txn:
        for key, value in txn.scan(store.tables.frames, keys.frame_key(sid, after + 1)):
            if not key.startswith(prefix):
                break
            frame = frame_of(value)
            # A format 2 FULL frame (sealed or not) starts a new chain: decode it whole.
            if len(frames) == MAX_ADVANCE_FRAMES or is_full_v2(frame):
                return None
            frames.append(frame)
            last_key, last_value = key, value
        # Keys are unique and sorted from after + 1: they are exactly after + 1..after + n if the last is.
        if last_key is None or keys.frame_version(last_key, sid) != after + len(frames):
            return None
        latest = reader.advance(frames, max_output_bytes=max_output_bytes)
        if latest is None:
            return None
        info = version_info(session_id, latest.header.version, last_value, header=latest.header)
        if events is not None:
            page = events.page(txn, store, session_id, len(latest.state))
    return GetResult(info.version, latest.state, info), page


def read_info(
    store: Store, session_id: str, version: int = 0, *, events: HeadEvents | None = None
) -> tuple[VersionInfo, EventPage | None]:
    """What a Get of ``version`` (0: the head) answers besides the state: the version's VersionInfo (its
    ``state_xxh3`` too) from its stored value's record and frame header, nothing decompressed; with
    ``events``, the page read in the same transaction. NotFound and DataLoss as the Get would raise them.

    For a Get whose caller holds a state (GetRequest.known_state_xxh3): if it is this version's, the state
    need not be decoded, nor sent."""
    sid = keys.session_key(session_id)
    check_version_arg(version)
    if events is not None:
        events.check()
    page = None
    prefix = sid + keys.SEP
    with store.read() as txn:
        frames = store.tables.frames
        if version:
            value = txn.get(keys.frame_key(sid, version), db=frames)
            target = version
        else:
            last = next(txn.scan_back(frames, sid + AFTER_SEP), None)
            value = target = None
            if last is not None and last[0].startswith(prefix):
                value, target = last[1], keys.frame_version(last[0], sid)
        if value is None or target is None:  # no frame stored for it: the session record says why
            refuse_unstored(txn, store.tables, sid, session_id, version)
        info = version_info(session_id, target, value)
        if events is not None:
            page = events.page(txn, store, session_id, 0)
    return info, page
