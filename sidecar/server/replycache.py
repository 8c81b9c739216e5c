"""Replies to Gets that the gRPC process answers itself, without its store process.

Forwarded, a Get's state crosses the link to the store process and back:
for a ~300 KB state that made a hot Get ~0.7 ms slower than in one process
(p50 2,241-2,687 us against 1,283-1,324, on a 2-core VM). So the gRPC
process keeps the serialized replies of recent latest-version Gets and
answers a Get from one while LMDB's committed head is still the version it
holds: one read transaction of the session's record, nothing decoded. A
reply is never answered for a state that is not the committed head: a
write, a delete, a quiet keyframe or another worker's write all change the
record, and the next Get is forwarded (and its reply kept in turn).

A Get of the latest version that misses (the head moved) is read here; the
head's chain decoded whole from its FULL frame costs 300-1000 us for a
LangGraph thread's 30-330 KB state, where the store process that wrote it
holds it decoded. So beside the replies, in the same budget, the cache
keeps the reader of the head it last read of a session (its state and its
chain's live zstd stream, store/headreads.py) and reads the next head by
advancing it with the frames written since. A reader never answers on
trust: frames that do not link to it or a state whose xxh3 fails (the
session deleted and written again, a frame rewritten, another worker's
writes) and the head is read whole, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

from google.protobuf.message import DecodeError

from ckpt.v1 import service_pb2

from ...codec import ChainReader, FieldMaskError, FrameKind
from ...codec.fieldmask import check_paths
from ..store import LRU, EventPage, EventQuery, GetResult, HeadEvents, Store, advance_head, read_head
from .convert import get_response_pb
from .inlineevents import INLINE_EVENTS_BOUND
from .masking import Masks

log = logging.getLogger(__name__)

# What an entry keeps besides its reply's bytes and its key's: the tuple, its
# ints, the key object's header and the LRU's node (339 B with a 16-byte id,
# tracemalloc over 20,000 entries, CPython 3.11).
_ENTRY_BYTES = 330
#: The largest state a Get of an older version decodes in this process, on its event loop (a larger one
#: is forwarded, and the store process decodes it off its loop). A Get of the latest version is bounded
#: by the work its read does instead (below).
INLINE_READ_MAX_STATE_BYTES = 256 * 1024
#: The most a read of the latest version decompresses here, on the event loop: opening a chain, its FULL
#: frame's state, its patches and its DELTAs' whole states; advancing a kept reader, the new frames'
#: patches and DELTA states. Measured (codec alone, this 2-core VM, a text-like state): zstd outputs
#: ~600-720 MB/s, so a FULL frame of 423 KB and four patches decode in ~0.6 ms, 106 KB in 0.15 ms. So
#: 512 KiB holds the loop ~0.7 ms at most, where the 256 KiB bound on the state let a chain of DELTA
#: frames output 64 whole states; the largest read it refuses is forwarded.
INLINE_READ_MAX_OUTPUT_BYTES = 512 * 1024
#: The largest state a kept reader advances to, the new frames' output within the bound above. What
#: such a read costs besides its new frames is linear in the state, at memory speed: the state copied
#: once with its patches, its xxh3, the reply serialized: measured 0.2-0.25 ms per MB for the first two
#: and 0.1-0.3 ms per MB for the third (~1 ms for 2 MiB), where forwarding the same reply costs this loop
#: ~0.2 ms per MB anyway (its pieces joined, then parsed to be kept). A larger head is forwarded.
INLINE_ADVANCE_MAX_STATE_BYTES = 2 * 1024 * 1024
#: The masked replies' share of the budget: 1/8.
_MASKED_SHARE = 8
#: What a kept head reader weighs besides its state, its key and its stream's window (2**window_log): the
#: zstd decompression context and its block buffers, and the Python objects. Measured (RSS over 100
#: readers of MERGE chains, CPython 3.11): 136 KiB besides a 70 KB state with a 64 KiB window, 271 KiB
#: besides 160 KB with 256 KiB, 529 KiB besides 420 KB with 1 MiB (a window fills only as far as its
#: stream's output): counted as 200, 336 and 1,104 KiB.
_READER_BYTES = 80 * 1024
#: Readers whose stream's window is larger are not kept (8 MiB).
_MAX_READER_WINDOW_LOG = 23
#: Nor those of smaller states: decoding such a chain whole costs little, and a reader weighs at least
#: _READER_BYTES plus a 64 KiB window.
_MIN_READER_STATE_BYTES = 16 * 1024
#: A reader's key: the session id's, then a NUL (which no session id holds).
_READER_KEY_SUFFIX = b"\0"


class _Reply(NamedTuple):
    version: int
    created_unix_nanos: int
    full_frame: bool
    #: The GetResponse's bytes, as the store process serialized them.
    body: bytes
    #: Its state's size (what a Get counts as sent).
    state_bytes: int
    #: The size of its key (the session id, UTF-8; and the mask's paths, for a masked reply).
    key_bytes: int
    #: A masked reply's: the registered types' generation its mask was judged by.
    types_generation: int = -1


class _Kept(NamedTuple):
    """A session's head reader, kept to read the next head by advancing it (replies' LRU, its own key)."""

    reader: ChainReader
    key_bytes: int


def _weigh(entry: _Reply | _Kept) -> int:
    if isinstance(entry, _Kept):
        reader = entry.reader
        return _READER_BYTES + entry.key_bytes + len(reader.latest.state) + (1 << reader.window_log)
    return _ENTRY_BYTES + entry.key_bytes + len(entry.body)


class ReplyCache:
    """Serialized Get replies by session, bounded by ``capacity_bytes``; on the event loop only.

    ``store`` is a read-only Store on the data directory the store process
    writes (LMDB serves readers in other processes consistently).
    """

    def __init__(self, store: Store, capacity_bytes: int) -> None:
        if not store.readonly:
            raise ValueError("a ReplyCache reads heads from a read-only Store (the store process writes)")
        self._store = store
        self._masks = Masks(store)
        # The bytes bound the count too: every entry weighs at least _ENTRY_BYTES.
        self._replies: LRU[_Reply | _Kept] = LRU(
            capacity_bytes // _ENTRY_BYTES, max_weight=capacity_bytes, weigh=_weigh
        )
        # Masked replies apart, by session and mask: a Get of the whole state never meets one. They are
        # small (a handoff note and a plan), so an eighth of the budget holds many.
        masked_bytes = capacity_bytes // _MASKED_SHARE
        self._masked: LRU[_Reply] = LRU(masked_bytes // _ENTRY_BYTES, max_weight=masked_bytes, weigh=_weigh)
        #: Heads read by advancing a kept reader (the rest of the Gets read here decoded a chain whole).
        self.advanced = 0

    def answer(self, session_id: str, version: int) -> tuple[bytes, int] | None:
        """The reply to a Get of ``version`` (0: the latest) and its state's size, if kept and still the
        head; None: forward it."""
        reply = self._current(self._replies, session_id.encode(), session_id, version)
        return None if reply is None else (reply.body, reply.state_bytes)

    def _current(self, replies: LRU[Any], key: bytes, session_id: str, version: int) -> _Reply | None:
        """The reply kept under ``key`` if it answers a Get of ``version`` and is still the head (else it is
        dropped); None otherwise."""
        reply = replies.get(key)
        if not isinstance(reply, _Reply) or (version and version != reply.version):
            return None
        try:
            current = self._store.is_head(
                session_id, reply.version, reply.created_unix_nanos, full_frame=reply.full_frame
            )
        except Exception:  # let the store process read it (and report what is wrong)
            current = False
        if not current:
            replies.discard(key)
            return None
        return reply

    def read(
        self, session_id: str, version: int, events: EventQuery | None = None, *, max_page_bytes: int = 0
    ) -> tuple[bytes, int, EventPage | None] | None:
        """The reply to a Get read from LMDB in this process, and its state's size; None: forward it.

        A Get the cache misses need not cross the link either: LMDB serves a read transaction in
        this process the same committed data the store process would read, so a cold Get costs a
        decode here rather than a hop to the store process and back with the state's bytes (measured
        ~2.2x an echo of the same bytes forwarded, ~1.7x read here, on a 10 KB state). This runs on the
        event loop, so only reads of bounded work: the latest version's within INLINE_READ_MAX_OUTPUT_BYTES
        of decompression (a kept reader's advance up to INLINE_ADVANCE_MAX_STATE_BYTES), an older one's
        up to INLINE_READ_MAX_STATE_BYTES. Anything else, and anything the store refuses or finds wrong
        (an unknown session, damage), is forwarded, so the store process answers it, with the status it
        always gave.

        ``events``: also a page of the session's events, read in the same read transaction within
        INLINE_EVENTS_BOUND (pages ending short of ``max_page_bytes``), else None: forward the Get. The
        reply is the state's alone (the one kept); the page comes apart.
        """
        read = self._read(session_id, version, events, max_page_bytes)
        return None if read is None else (read[1].body, read[1].state_bytes, read[2])

    def _read(
        self, session_id: str, version: int, events: EventQuery | None = None, max_page_bytes: int = 0
    ) -> tuple[GetResult, _Reply, EventPage | None] | None:
        """The state read here (see :meth:`read`), its whole reply, kept if it is the latest's, and with
        ``events`` the page read with it."""
        page = None
        try:
            if not version:
                got, page = self._read_head(session_id, events, max_page_bytes)
            elif events is None:
                got = self._store.get(session_id, version, use_cache=False, max_state_bytes=INLINE_READ_MAX_STATE_BYTES)
            else:
                both = self._store.get_with_events(
                    session_id,
                    version,
                    events=events,
                    use_cache=False,
                    max_state_bytes=INLINE_READ_MAX_STATE_BYTES,
                    max_page_bytes=max_page_bytes,
                    bound=INLINE_EVENTS_BOUND,
                )
                got, page = both.got, both.events
        except Exception:  # let the store process read it (and report what is wrong)
            return None
        key = session_id.encode()
        reply = self._reply(got, key)
        if not version:
            self._replies.put(key, reply)
        return got, reply, page

    def _read_head(
        self, session_id: str, events: EventQuery | None, max_page_bytes: int
    ) -> tuple[GetResult, EventPage | None]:
        """The latest version (and with ``events`` a page read with it): by advancing the reader kept of
        the session, if that reaches it, else decoded whole (keeping its reader); raises what the store
        raises."""
        key = session_id.encode() + _READER_KEY_SUFFIX
        with_events = None
        if events is not None:
            with_events = HeadEvents(events, max_page_bytes=max_page_bytes, bound=INLINE_EVENTS_BOUND)
        kept = self._replies.get(key)
        if isinstance(kept, _Kept):
            try:
                advanced = advance_head(
                    self._store,
                    session_id,
                    kept.reader,
                    max_output_bytes=INLINE_READ_MAX_OUTPUT_BYTES,
                    events=with_events,
                )
            except Exception:  # read whole below: that names what is wrong, or the store process does
                advanced = None
            if advanced is not None:
                self.advanced += 1
                self._replies.put(key, kept)  # weighed again: the state changed
                return advanced
            self._replies.discard(key)
        got, reader, page = read_head(
            self._store,
            session_id,
            max_state_bytes=INLINE_ADVANCE_MAX_STATE_BYTES,
            max_output_bytes=INLINE_READ_MAX_OUTPUT_BYTES,
            events=with_events,
        )
        if (
            reader is not None
            and reader.window_log <= _MAX_READER_WINDOW_LOG
            and len(got.state) >= _MIN_READER_STATE_BYTES
        ):
            self._replies.put(key, _Kept(reader, len(key)))
        return got, page

    def masked(
        self,
        session_id: str,
        version: int,
        paths: Sequence[str],
        events: EventQuery | None = None,
        *,
        max_page_bytes: int = 0,
    ) -> tuple[bytes, int, bool, EventPage | None] | None:
        """The reply to a Get masked to ``paths``, its state's size, whether it came from a reply kept, and
        with ``events`` the page read with the state when it was read here (as :meth:`read` reads it; None
        from a reply kept); None: forward it (a malformed path too: the store process names it). Made from
        the masked reply kept for this mask, else from the whole state's reply kept (:meth:`answer`), else
        from the state read here (as :meth:`read` does, keeping its whole reply); a latest-version one is
        kept apart from the whole replies.
        """
        try:
            key = _masked_key(session_id, check_paths(paths))
        except FieldMaskError:
            return None
        try:
            # A re-registration may have renamed a field since: a mask is judged by the types in force.
            generation = self._store.types_generation()
        except Exception:  # let the store process read it (and report what is wrong)
            return None
        kept = self._current(self._masked, key, session_id, version)
        if kept is not None and kept.types_generation == generation:
            return kept.body, kept.state_bytes, True, None
        page = None
        whole = self._current(self._replies, session_id.encode(), session_id, version)
        if whole is not None:
            masked = self._masks.masked_reply(whole.body, paths)
            if masked is None:
                return None
            body, state_bytes = masked
            reply = whole._replace(body=body, state_bytes=state_bytes, key_bytes=len(key), types_generation=generation)
        else:
            read = self._read(session_id, version, events, max_page_bytes)
            if read is None:
                return None
            got, reply, page = read
            if len(got.state) > INLINE_READ_MAX_STATE_BYTES:
                return None  # parsing it to mask would hold the loop: the store process masks it off its loop
            state = self._masks.try_masked(got.info.message_type, got.state, paths)
            if state is None:
                return None
            body = get_response_pb(GetResult(got.version, state, got.info)).SerializeToString()
            reply = reply._replace(body=body, state_bytes=len(state), key_bytes=len(key), types_generation=generation)
        if not version:
            self._masked.put(key, reply)
        return reply.body, reply.state_bytes, whole is not None, page

    def remember_masked(self, session_id: str, paths: Sequence[str], body: bytes, types_generation: int) -> None:
        """Keep the store process's reply to a Get of ``session_id``'s latest version masked to ``paths``,
        asked when the types' generation was ``types_generation`` (:meth:`types_generation`): the store
        process judged the mask by those types or later ones, and a later one drops the reply."""
        key = _masked_key(session_id, paths)
        reply = self._parsed(body, len(key))
        if reply is not None:
            self._masked.put(key, reply._replace(types_generation=types_generation))

    def types_generation(self) -> int | None:
        """The registered types' generation now (None if it cannot be read: the store process says why)."""
        try:
            return self._store.types_generation()
        except Exception:
            return None

    def remember(self, session_id: str, body: bytes) -> None:
        """Keep the store process's reply to a Get of ``session_id``'s latest version."""
        key = session_id.encode()
        reply = self._parsed(body, len(key))
        if reply is not None:
            # One heavier than the whole cache is not kept (the LRU drops it, and evicts nothing for it).
            self._replies.put(key, reply)

    @staticmethod
    def _parsed(body: bytes, key_bytes: int) -> _Reply | None:
        try:
            response = service_pb2.GetResponse.FromString(body)  # ~12 us for a 300 KB state
        except DecodeError:  # a bug; the Get itself is answered all the same
            log.exception("a Get reply from the store process does not parse; not kept")
            return None
        info = response.info
        created = info.created_at.seconds * 1_000_000_000 + info.created_at.nanos
        full = info.frame_kind == service_pb2.FRAME_KIND_FULL
        return _Reply(response.version, created, full, body, len(response.state), key_bytes)

    @staticmethod
    def _reply(got: GetResult, key: bytes) -> _Reply:
        """A read's reply, as a forwarded one would be kept, without parsing it back."""
        info = got.info
        body = get_response_pb(got).SerializeToString()
        return _Reply(
            got.version, info.created_unix_nanos, info.frame_kind is FrameKind.FULL, body, len(got.state), len(key)
        )

    def close(self) -> None:
        self._replies.clear()
        self._masked.clear()
        self._store.close()

    @property
    def size_bytes(self) -> int:
        return self._replies.weight + self._masked.weight

    def __len__(self) -> int:
        return len(self._replies) + len(self._masked)


def _masked_key(session_id: str, paths: Sequence[str]) -> bytes:
    # No session id holds a NUL (control characters are refused), nor does a well-formed path (the only
    # ones kept: a masked Get with another is refused): one key per pair.
    return "\0".join((session_id, *paths)).encode()
