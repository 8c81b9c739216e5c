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
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import NamedTuple

from google.protobuf.message import DecodeError

from ckpt.v1 import service_pb2

from ...codec import FrameKind
from ..store import LRU, Store
from .convert import get_response_pb
from .masking import Masks

log = logging.getLogger(__name__)

# What an entry keeps besides its reply's bytes and its key's: the tuple, its
# ints, the key object's header and the LRU's node (339 B with a 16-byte id,
# tracemalloc over 20,000 entries, CPython 3.11).
_ENTRY_BYTES = 330
#: The largest state a Get decodes in this process, on its event loop: ~0.3 ms of decoding at most, so
#: other calls wait no longer than that. A larger one is forwarded, and the store process decodes it
#: off its loop.
INLINE_READ_MAX_STATE_BYTES = 256 * 1024


class _Reply(NamedTuple):
    version: int
    created_unix_nanos: int
    full_frame: bool
    #: The GetResponse's bytes, as the store process serialized them.
    body: bytes
    #: Its state's size (what a Get counts as sent).
    state_bytes: int
    #: The size of its key (the session id, UTF-8).
    key_bytes: int


def _weigh(reply: _Reply) -> int:
    return _ENTRY_BYTES + reply.key_bytes + len(reply.body)


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
        self._replies: LRU[_Reply] = LRU(capacity_bytes // _ENTRY_BYTES, max_weight=capacity_bytes, weigh=_weigh)

    def answer(self, session_id: str, version: int) -> tuple[bytes, int] | None:
        """The reply to a Get of ``version`` (0: the latest) and its state's size, if kept and still the
        head; None: forward it."""
        key = session_id.encode()
        reply = self._replies.get(key)
        if reply is None or (version and version != reply.version):
            return None
        try:
            current = self._store.is_head(
                session_id, reply.version, reply.created_unix_nanos, full_frame=reply.full_frame
            )
        except Exception:  # let the store process read it (and report what is wrong)
            current = False
        if not current:
            self._replies.discard(key)
            return None
        return reply.body, reply.state_bytes

    def read(self, session_id: str, version: int) -> tuple[bytes, int] | None:
        """The reply to a Get read from LMDB in this process, and its state's size; None: forward it.

        A Get the cache misses need not cross the link either: LMDB serves a read transaction in
        this process the same committed data the store process would read, so a cold Get costs a
        decode here rather than a hop to the store process and back with the state's bytes (measured
        ~2.2x an echo of the same bytes forwarded, ~1.7x read here, on a 10 KB state). Only states up
        to INLINE_READ_MAX_STATE_BYTES: this runs on the event loop. Anything else, and anything the
        store refuses or finds wrong (an unknown session, damage), is forwarded, so the store process
        answers it, with the status it always gave.
        """
        try:
            got = self._store.get(session_id, version, use_cache=False, max_state_bytes=INLINE_READ_MAX_STATE_BYTES)
        except Exception:  # let the store process read it (and report what is wrong)
            return None
        body = get_response_pb(got).SerializeToString()
        if not version:  # kept as a forwarded reply would be, without parsing it back
            info = got.info
            self._keep(
                session_id,
                got.version,
                info.created_unix_nanos,
                info.frame_kind is FrameKind.FULL,
                body,
                len(got.state),
            )
        return body, len(got.state)

    def masked(self, session_id: str, version: int, paths: Sequence[str]) -> tuple[bytes, int, bool] | None:
        """The reply to a Get masked to ``paths``, made from the whole state's reply kept (:meth:`answer`) or
        read here (:meth:`read`, which keeps it), its state's size, and whether it was kept; None: forward
        it. The masked reply itself is never kept: a Get of the whole state must not be answered with it.
        """
        cached = True
        whole = self.answer(session_id, version)
        if whole is None:
            cached = False
            whole = self.read(session_id, version)
            if whole is None:
                return None
        reply = self._masks.masked_reply(whole[0], paths)
        return None if reply is None else (*reply, cached)

    def remember(self, session_id: str, body: bytes) -> None:
        """Keep the store process's reply to a Get of ``session_id``'s latest version."""
        try:
            response = service_pb2.GetResponse.FromString(body)  # ~12 us for a 300 KB state
        except DecodeError:  # a bug; the Get itself is answered all the same
            log.exception("a Get reply from the store process does not parse; not kept")
            return
        info = response.info
        created = info.created_at.seconds * 1_000_000_000 + info.created_at.nanos
        full = info.frame_kind == service_pb2.FRAME_KIND_FULL
        self._keep(session_id, response.version, created, full, body, len(response.state))

    def _keep(self, session_id: str, version: int, created: int, full: bool, body: bytes, state_bytes: int) -> None:
        key = session_id.encode()
        # One heavier than the whole cache is not kept (the LRU drops it, and evicts nothing for it).
        self._replies.put(key, _Reply(version, created, full, body, state_bytes, len(key)))

    def close(self) -> None:
        self._replies.clear()
        self._store.close()

    @property
    def size_bytes(self) -> int:
        return self._replies.weight

    def __len__(self) -> int:
        return len(self._replies)
