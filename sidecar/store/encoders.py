"""The writer's chain encoders, cached per session, and the caches a committed write leaves behind.

An encoder holds a session's head state and its chain's zstd stream, so the
next write to the session encodes against it without reading storage. The
encoder cache belongs to the writer thread. A batch that fails drops every
encoder it touched; the session's next write resumes its chain from storage.

A typed session's encoder compacts MERGE states with its type's message class
(registry.py). A cached encoder built with another class (the session typed
since, or its type registered again) is not used: the session's next write
resumes its chain from storage with the current one.
"""

from __future__ import annotations

import weakref

from google.protobuf.message import Message

from ckpt.store.v1 import records_pb2

from ...codec import ChainEncoder, DecodeError, StateSnapshot, decode, parse
from ..config import StoreConfig
from ..errors import DataLoss
from ..storage import ReadTxn
from . import keys
from .cache import LRU, StateCache
from .coherence import Coherence
from .layout import Tables
from .ops import Batch
from .reads import chain_frames
from .records import frame_of, written_state_xxh3
from .types import VersionInfo


def _encoder_memory(encoder: ChainEncoder) -> int:
    return encoder.memory_bytes


class Encoders:
    """Cached encoders (writer thread only) beside the state cache (shared with readers)."""

    def __init__(self, config: StoreConfig, tables: Tables, states: StateCache, coherence: Coherence | None) -> None:
        self._config = config
        self._tables = tables
        self.states = states
        #: Set when other processes write the same data (Store(shared=True)): what is cached is checked first.
        self.coherence = coherence
        self.lru: LRU[ChainEncoder] = LRU(
            config.encoder_cache_entries, max_weight=config.encoder_cache_bytes, weigh=_encoder_memory
        )
        # The class each encoder compacts MERGE states with (None: none).
        self._compacts: weakref.WeakKeyDictionary[ChainEncoder, type[Message] | None] = weakref.WeakKeyDictionary()

    def new(self, compact: type[Message] | None = None) -> ChainEncoder:
        """A new session's encoder, compacting MERGE states as ``compact`` (a typed session's class)."""
        encoder = ChainEncoder(policy=self._config.chain_policy, compact_message_type=compact)
        self.adopt(encoder, compact)
        return encoder

    def adopt(self, encoder: ChainEncoder, compact: type[Message] | None) -> None:
        """Note that ``encoder``, made as ``ChainEncoder(compact_message_type=compact)`` off the writer
        thread (a fork's), compacts MERGE states as ``compact``: the cache keeps it only for that class."""
        if compact is not None:
            self._compacts[encoder] = compact

    def take(
        self, sid: bytes, encoder: ChainEncoder, compact: type[Message] | None, rec: records_pb2.SessionRecord | None
    ) -> None:
        """Cache ``encoder``, made off the writer thread at the session's head ``rec`` (None: a new session)
        and advanced by the write being applied (encodeahead.py), in place of the one cached."""
        self.adopt(encoder, compact)
        if rec is not None and self.coherence is not None:
            self.coherence.note_encoder(encoder, rec.created_unix_nanos)
        self.lru.put(sid, encoder)

    def for_session(
        self,
        txn: ReadTxn,
        sid: bytes,
        session_id: str,
        rec: records_pb2.SessionRecord | None,
        compact: type[Message] | None = None,
    ) -> ChainEncoder:
        """The encoder continuing the session's stored chain (a new one for a new session), now cached,
        compacting MERGE states as ``compact``."""
        if rec is None:
            encoder = self.new(compact)
            self.lru.put(sid, encoder)
            return encoder
        cached = self.lru.get(sid)
        if (
            cached is not None
            and cached.version == rec.head_version
            # (an empty map first: a store without typed sessions pays no weak reference per write)
            and (self._compacts.get(cached) if self._compacts else None) is compact
            and (self.coherence is None or self.coherence.continues_chain(cached, rec))
        ):
            return cached
        chain = chain_frames(txn, self._tables, sid, session_id, rec, rec.head_version)
        try:
            state = decode(chain)
            headers = [parse(f)[0] for f in chain]
        except DecodeError as exc:
            raise DataLoss(f"session {session_id!r} version {rec.head_version}: {exc}") from None
        encoder = ChainEncoder.resume(state, headers, policy=self._config.chain_policy, compact_message_type=compact)
        if compact is not None:
            self._compacts[encoder] = compact
        if self.coherence is not None:
            self.coherence.note_encoder(encoder, rec.created_unix_nanos)
        # A batch that aborts drops every encoder it touched.
        self.lru.put(sid, encoder)
        return encoder

    def head_has_xxh3(
        self, txn: ReadTxn, sid: bytes, session_id: str, rec: records_pb2.SessionRecord | None, xxh3: int
    ) -> bool:
        """Whether the session's head state has XXH3-64 ``xxh3``, for a write's expected_state_xxh3 (False: it
        has no head): its cached encoder's (the head it holds), else what the head frame's header records,
        or what the state had as written if a fold stored it compacted since (folds.py)."""
        if rec is None or not rec.head_version:
            return False
        cached = self.lru.get(sid)
        if (
            cached is not None
            and cached.version == rec.head_version
            and (self.coherence is None or self.coherence.continues_chain(cached, rec))
            and cached.state_xxh3 == xxh3
        ):
            return True
        value = txn.get(keys.frame_key(sid, rec.head_version), db=self._tables.frames)
        if value is None:
            raise DataLoss(f"session {session_id!r} version {rec.head_version}: its frame is missing")
        try:
            header, _ = parse(frame_of(value))
        except DecodeError as exc:
            raise DataLoss(f"session {session_id!r} version {rec.head_version}: {exc}") from None
        return header.state_xxh3 == xxh3 or written_state_xxh3(session_id, rec.head_version, value) == xxh3

    def hold(self, batch: Batch, sid: bytes, encoder: ChainEncoder) -> ChainEncoder | None:
        """``encoder`` if the batch may keep it until its commit, for the encoder cache; else None.

        Each encoder a batch keeps holds its head state and zstd stream until
        the commit: 512 writes of 300 KB states held ~1.5 GiB against a 16 MiB
        encoder_cache_bytes, though the cache evicts all but its budget at the
        commit. So a batch keeps at most the cache's budget (entries and bytes)
        of encoders; any other is dropped now, as if evicted (the session's
        next write resumes its chain from storage).
        """
        config = self._config
        weight = encoder.memory_bytes
        if weight > config.encoder_cache_bytes >= encoder.state_size:
            # Too large to be cached with its stream (a large state's FULL frame opens a window twice its
            # size), it would be dropped, and the session's next write would read and decode its chain
            # on the writer thread (~1 s for 150 MB) only to start a new stream: that write starts one.
            encoder.release_stream()
            weight = encoder.memory_bytes
        old = batch.held_encoders.get(sid)
        if old is None and (
            len(batch.held_encoders) >= config.encoder_cache_entries
            or batch.held_encoder_bytes + weight > config.encoder_cache_bytes
        ):
            self.lru.discard(sid)
            return None
        # A session already kept by this batch stays kept: an earlier write's
        # closure holds its encoder anyway.
        batch.held_encoders[sid] = weight
        batch.held_encoder_bytes += weight - (old or 0)
        return encoder

    def after_write(self, sid: bytes, encoder: ChainEncoder | None, head: StateSnapshot, info: VersionInfo) -> None:
        """After the commit: the write's encoder back in the cache (or gone: see :meth:`hold`), its state cached."""
        if encoder is None:
            self.lru.discard(sid)
        else:
            self.lru.put(sid, encoder)  # refreshes its LRU position
        self.states.put(sid, head, info)

    def discard(self, sid: bytes) -> None:
        """Drop the session's encoder (its chain moved on without it)."""
        self.lru.discard(sid)

    def forget(self, sid: bytes) -> None:
        """Drop what is cached of the session: its encoder and its state."""
        self.lru.discard(sid)
        self.states.discard(sid)

    def clear(self) -> None:
        """Drop every encoder and cached state (after a batch that may or may not have committed)."""
        self.lru.clear()
        self.states.clear()
