"""A large put's frame, encoded before its op reaches the writer.

The writer thread commits every session's writes, one batch at a time: a
frame it compresses there holds up every write queued behind it (a REPLACE
of a 150 MB state, or the FULL frame a MERGE onto a 150 MB head starts a
chain with: 0.7-4 s). So, as a fork's source is (forksource.py), a large
put's frame is encoded on its caller's thread (a worker thread in the
sidecar) by an encoder resumed at the session's head as a read transaction
sees it: the writer's own encoder would be resumed so, were it not cached.
In its transaction the writer only checks that the head is still that one
(:meth:`EncodedAhead.holds`: O(1), no frame decoded), stores the frame and
caches the encoder, whose zstd stream the frame started: the session's next
write continues it. Should the head have moved (a write of the same session
committed meanwhile), the writer encodes the put itself, as it always did.

Which puts: a REPLACE of ENCODE_AHEAD_BYTES or more, whatever frame it makes
(a DELTA against the head, or FULL); a MERGE only when its frame starts a
chain (a FULL frame of the head and the patch) and that state is as large.
The other MERGE frames continue the zstd stream the writer's cached encoder
holds, which only the writer may touch: they stay there (O(patch) each).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import NamedTuple

from google.protobuf.message import Message

from ckpt.store.v1 import records_pb2

from ...codec import ChainEncoder, ChainPolicy, CodecError, EncodedFrame, FrameHeader, FrameKind, decode
from ...codec.chainstats import ChainStats, merge_plan
from ...codec.decoder import scanned_frame_header
from ..config import StoreConfig
from ..errors import StoreError
from ..storage import ReadTxn
from . import keys
from .cache import StateCache
from .forksource import recorded_state_xxh3
from .layout import Tables
from .reads import chain_frames
from .records import frame_of, record
from .registry import Registry
from .types import WriteMode

#: A put whose new state has at least this many bytes is encoded before it is queued. zstd at the
#: chain policy's level 3 compresses some 150-400 MB/s, so 1 MiB is 3-7 ms of the writer's time that
#: every write queued behind it would wait out; below that, the read of the head it takes first (the
#: session's record and its chain's frame headers, and its state) costs about what it would save.
ENCODE_AHEAD_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class EncodedAhead:
    """A put's frame, encoded against the head its session had when read, and what that head was."""

    #: The session record's creation time (0: there was no session).
    created_unix_nanos: int
    #: The record's last write time: its head's creation time (a head written again differs).
    updated_unix_nanos: int
    head_version: int
    chain_start_version: int
    #: XXH3-64 of the head state, as its frame's header records it (0: no head).
    head_xxh3: int
    #: The head state's size: what a MERGE is checked against max_state_bytes with.
    head_size: int
    #: The class the encoder compacts MERGE states with (None: none, an untyped session).
    compact: type[Message] | None
    #: Resumed at the head (new, for a new session), then advanced by ``frame``.
    encoder: ChainEncoder
    frame: EncodedFrame

    def holds(
        self,
        txn: ReadTxn,
        tables: Tables,
        sid: bytes,
        rec: records_pb2.SessionRecord | None,
        compact: type[Message] | None,
    ) -> bool:
        """Whether the session's head, as ``txn`` sees it (``rec``), is the one the frame was encoded
        against, ``compact`` the class the writer would encode with, and the encoder still at the frame
        (no frame decoded).

        The same record (not deleted and written again), at the same head
        version and chain start (not rewritten as a keyframe since), whose head
        frame's header records the same state's checksum. The encoder is at
        the frame's version unless it was rolled back (the write was not
        stored) or a later write continued it (a batch redone after it had).
        """
        if compact is not self.compact or self.encoder.version != self.frame.version:
            return False
        if rec is None:
            return not self.created_unix_nanos
        if (
            rec.created_unix_nanos != self.created_unix_nanos
            or rec.updated_unix_nanos != self.updated_unix_nanos
            or rec.head_version != self.head_version
            or rec.chain_start_version != self.chain_start_version
        ):
            return False
        value = txn.get(keys.frame_key(sid, rec.head_version), db=tables.frames)
        return value is not None and recorded_state_xxh3(value) == self.head_xxh3


class _Head(NamedTuple):
    """A session's head, as read for encoding a put against it."""

    rec: records_pb2.SessionRecord | None
    #: The headers of the head's chain, FULL frame first (none: a new session).
    headers: list[FrameHeader]
    state: bytes
    compact: type[Message] | None


@dataclass(frozen=True, slots=True)
class Ahead:
    """What encoding a put ahead needs of the store."""

    config: StoreConfig
    tables: Tables
    states: StateCache
    registry: Registry
    read: Callable[[], AbstractContextManager[ReadTxn]]
    #: StoreConfig.merge_message_type ("": none).
    merge_type: str

    def worth(self, sid: bytes, state_size: int, mode: WriteMode) -> bool:
        """Whether a put may be encoded ahead, judged without reading storage (a MERGE: by the head the
        state cache holds, if any): a REPLACE of ENCODE_AHEAD_BYTES or more, a MERGE making that much."""
        if mode is WriteMode.MERGE and state_size < ENCODE_AHEAD_BYTES:
            cached = self.states.peek(sid)
            return cached is not None and cached.info.state_size + state_size >= ENCODE_AHEAD_BYTES
        return state_size >= ENCODE_AHEAD_BYTES

    def encode(self, sid: bytes, session_id: str, state: bytes, mode: WriteMode, named: str) -> EncodedAhead | None:
        """The put's frame encoded against the session's head now (``named``: the put's message_type), or
        None: not a large put (see the module's docstring), or one the writer refuses or decides otherwise.

        A MERGE's patch must have been checked (check_state).
        """
        if mode is WriteMode.REPLACE and len(state) < ENCODE_AHEAD_BYTES:
            return None
        try:
            with self.read() as txn:  # held for the reads only: encoding needs no snapshot
                head = self._read_head(txn, sid, session_id, len(state), mode, named)
            if head is None:
                return None
            return _encode(head, state, mode, self.config.chain_policy)
        except (StoreError, CodecError, ValueError):
            return None  # the writer's transaction reads the head again, and fails as it finds it there

    def _read_head(
        self, txn: ReadTxn, sid: bytes, session_id: str, size: int, mode: WriteMode, named: str
    ) -> _Head | None:
        tables, registry = self.tables, self.registry
        raw = txn.get(sid, db=tables.sessions)
        rec = record(raw) if raw is not None else None
        have = rec.message_type if rec is not None else ""
        if named and have and named != have:
            return None  # refused in the writer's transaction
        typed = named or have
        if not typed and mode is WriteMode.MERGE and self.merge_type:
            return None  # the store's default types the session only if its head parses: the writer decides
        compact = None
        if typed:
            if registry.shared:
                registry.sync(txn)
            compact = registry.resolve(typed)
            if compact is None:
                return None
        if rec is None:
            return _Head(None, [], b"", compact) if size >= ENCODE_AHEAD_BYTES else None
        if not rec.head_version or (mode is WriteMode.MERGE and not self._may_end_chain(txn, sid, rec, size)):
            return None
        chain = chain_frames(txn, tables, sid, session_id, rec, rec.head_version)
        # Not parse(): it checks each whole frame's checksum. The state is checked against the head's header.
        headers = [scanned_frame_header(frame) for frame in chain]
        last = headers[-1]
        if mode is WriteMode.MERGE:
            new_size = last.state_size + size
            if (
                new_size < ENCODE_AHEAD_BYTES
                or new_size > self.config.max_state_bytes
                or not merge_plan(self.config.chain_policy, ChainStats.of(headers), size)[0]
            ):
                return None
        cached = self.states.peek(sid)
        if (
            cached is not None
            and cached.info.version == last.version
            and cached.info.state_xxh3 == last.state_xxh3
            and len(cached.state) == last.state_size
        ):
            state = cached.state.tobytes()
        else:
            state = decode(chain)
        return _Head(rec, headers, state, compact)

    def _may_end_chain(self, txn: ReadTxn, sid: bytes, rec: records_pb2.SessionRecord, size: int) -> bool:
        """Whether a MERGE of ``size`` bytes onto the head may start a chain of ENCODE_AHEAD_BYTES or more,
        judged by the frames after the chain's FULL frame, whose state's size the first of them records
        as its base's: not by the FULL frame, as large as the state (a 75 MB read for a 150 MB one)."""
        start, depth = rec.chain_start_version, rec.head_version - rec.chain_start_version
        headers: list[FrameHeader] = []
        if not start or depth < 0:
            return True  # read whole, it fails as it finds it
        policy = self.config.chain_policy
        if depth > policy.max_depth:
            # Only segments keep a chain this long (codec FORMAT.md §14), and its versions are read through
            # few frames: it ends by its count of versions or the bytes its head materialises, judged by
            # the head's frame alone (reading every header since the FULL frame would cost each MERGE O(chain)).
            if depth + 1 >= policy.max_chain_versions:
                return True
            value = txn.get(keys.frame_key(sid, rec.head_version), db=self.tables.frames)
            if value is None:
                return True
            return scanned_frame_header(frame_of(value)).state_size + size > policy.max_materialized_bytes
        if not depth:
            cached = self.states.peek(sid)  # the head is the FULL frame: its size, if cached
            if cached is None or cached.info.version != rec.head_version:
                return True
            full_size = cached.info.state_size
        else:
            for i, (_, value) in enumerate(txn.scan(self.tables.frames, keys.frame_key(sid, start + 1))):
                header = scanned_frame_header(frame_of(value))
                if header.version != start + 1 + i:
                    return True  # not the chain its record names: read whole, it fails as it finds it
                headers.append(header)
                if len(headers) == depth:
                    break
            if len(headers) != depth:
                return True
            full_size = headers[0].base_size
        new_size = (headers[-1].state_size if headers else full_size) + size
        if new_size < ENCODE_AHEAD_BYTES:
            return False
        # The FULL frame as far as the policy looks at it (its size; a ratio of 1, as if unknown).
        full = FrameHeader(FrameKind.FULL, start, 0, full_size, 0, full_size, 0, 0, 0, 10, False, 2)
        return merge_plan(self.config.chain_policy, ChainStats.of([full, *headers]), size)[0]


def _encode(head: _Head, state: bytes, mode: WriteMode, policy: ChainPolicy) -> EncodedAhead:
    """The put's frame, from an encoder made as the writer makes one for the session (Encoders)."""
    rec = head.rec
    if rec is None:
        encoder = ChainEncoder(policy=policy, compact_message_type=head.compact)
    else:
        encoder = ChainEncoder.resume(head.state, head.headers, policy=policy, compact_message_type=head.compact)
    size = encoder.state_size
    # The patch was checked (check_state) before: the writer encodes it so too.
    frame = encoder.replace(state) if mode is WriteMode.REPLACE else encoder.merge(state, checked=True)
    if rec is None:
        return EncodedAhead(0, 0, 0, 0, 0, 0, head.compact, encoder, frame)
    last = head.headers[-1]
    return EncodedAhead(
        rec.created_unix_nanos,
        rec.updated_unix_nanos,
        rec.head_version,
        rec.chain_start_version,
        last.state_xxh3,
        size,
        head.compact,
        encoder,
        frame,
    )
