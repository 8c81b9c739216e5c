"""What this process caches, checked against the shared storage before use: the one place that does it.

When other processes write the same data (the workers of ``ckpt serve
--workers N`` on one LMDB today; sidecars on several hosts sharing one
PostgreSQL database next), a session may move on behind this process's
back. Its writes stay correct without help: every write reads the head
inside its own transaction (compare-and-set, request ids). What this
process caches is checked here:

- a cached **state** (the state cache, and caches outside the store such as
  the gRPC process's replies, through :meth:`Coherence.is_head`) is served
  only if the session's record still names it as the head: the same head
  version, written at the same time (a session deleted and written again
  to the same version differs), and not rewritten as a chain start since
  (a quiet keyframe by another process's sweeper);
- a cached **encoder** continues the stored chain only if the record's chain
  start and creation time are still the ones it was built from.

One record read per check, no state decoded. A second storage tier needs
nothing more of its own: the records are the same keys and values.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager

from ckpt.store.v1 import records_pb2

from ...codec import ChainEncoder, FrameKind
from ..storage import ReadTxn
from . import keys
from .args import check_int_arg
from .layout import Tables
from .records import record
from .types import VersionInfo


class Coherence:
    """Checks of cached states and encoders against the session records in storage."""

    def __init__(self, read: Callable[[], AbstractContextManager[ReadTxn]], tables: Tables) -> None:
        self._read = read
        self._tables = tables
        # The creation time of the session each cached encoder belongs to (a session
        # deleted and written again by another process may reach the same version and chain start).
        self._encoder_created: weakref.WeakKeyDictionary[ChainEncoder, int] = weakref.WeakKeyDictionary()

    def still_head(self, sid: bytes, info: VersionInfo) -> bool:
        """Whether the cached version ``info`` is the session's head in storage now."""
        return self.is_head(sid, info.version, info.created_unix_nanos, full_frame=info.frame_kind is FrameKind.FULL)

    def is_head_arg(self, session_id: str, version: int, created_unix_nanos: int, *, full_frame: bool) -> bool:
        """:meth:`is_head` of a caller's arguments (Store.is_head): InvalidArgument for one out of range."""
        sid = keys.session_key(session_id)
        check_int_arg("version", version)
        check_int_arg("created_unix_nanos", created_unix_nanos)
        return self.is_head(sid, version, created_unix_nanos, full_frame=full_frame)

    def is_head(self, sid: bytes, version: int, created_unix_nanos: int, *, full_frame: bool) -> bool:
        """Whether the version written at ``created_unix_nanos`` (stored as a FULL frame, or not) is the
        session's committed head now: one read transaction, nothing decoded."""
        with self._read() as txn:
            raw = txn.get(sid, db=self._tables.sessions)
            if raw is None:
                return False
            rec = record(raw)
        # Every write sets the record's updated time to its version's creation
        # time, so a session deleted and written again to the same version differs.
        if rec.head_version != version or rec.updated_unix_nanos != created_unix_nanos:
            return False
        # A quiet keyframe (another process's sweeper) rewrites the head's frame,
        # not its state: the cached metadata would still say DELTA and its size.
        return rec.chain_start_version != version or full_frame

    def note_encoder(self, encoder: ChainEncoder, created_unix_nanos: int) -> None:
        """Remember the creation time of the session ``encoder`` was built for."""
        self._encoder_created[encoder] = created_unix_nanos

    def continues_chain(self, encoder: ChainEncoder, rec: records_pb2.SessionRecord) -> bool:
        """Whether a cached encoder at the head's version still continues the stored chain.

        Another process may have rewritten the head as a chain start (a quiet
        keyframe), or deleted the session and written it again up to the same
        version: a frame continuing the encoder's zstd stream would then not
        decode.
        """
        return (
            encoder.chain.start_version == rec.chain_start_version
            and self._encoder_created.get(encoder) == rec.created_unix_nanos
        )
