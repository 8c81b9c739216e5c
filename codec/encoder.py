"""Turn a session's writes into frames: the encoder object and its chain bookkeeping."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import xxhash
from google.protobuf import message as _message

from . import _zstd
from .chainstats import ChainStats, chain_ends, merge_plan, started
from .compaction import compact
from .encoded import EncodedFrame, StateSnapshot
from .errors import EncodeError, MergeTooLargeError
from .frame import (
    FORMAT_VERSION,
    MAX_STATE_SIZE,
    MIN_PREFIX_SIZE,
    FrameHeader,
    FrameKind,
    state_checksum,
    write,
)
from .header import check_format_version
from .policy import DEFAULT_POLICY, ChainPolicy
from .wire import check_patch


@dataclass(slots=True)
class _Stream:
    """The live zstd stream that the next frame may continue."""

    compressor: _zstd.ZstdCompressor
    window_log: int
    table_log: int
    memory_bytes: int
    #: Made without a prefix: once its frame is ended, the next frame it
    #: starts references nothing, so a new chain can reuse it.
    prefix_free: bool
    #: Bytes taken since its frame began, prefix included. zstd's buffer holds one window: fed past it, it
    #: wraps, and deltas lose most of the state before them (a 140 KB state's one-line change: 19.5 KB, not 230 B).
    fed: int = 0


@dataclass(slots=True)
class _Undo:
    version: int
    chunks: list[bytes]
    chunk_count: int
    state_size: int
    hasher: xxhash.xxh3_64
    chain: ChainStats


Buffer = bytes | bytearray | memoryview
_MAX_VERSION = 2**64 - 1
#: A REPLACE stream of a small state (policy.small_state_bytes) restarted on its head leaves room for this many
#: more, so the DELTAs after it continue it: a restart costs the decoder a context (trajectory heads: 41 us, not 54).
_ROOM_STATES = 6


class ChainEncoder:
    """Encodes one session's successive states into frames.

    It keeps the head state and a live zstd stream, so that a frame that
    continues the stream costs O(its own content) to encode and the whole
    chain decodes in one zstd pass. Each call produces the frame of the next
    version; if that frame is not stored after all (the write was refused or
    failed), call :meth:`rollback` before encoding anything else, and once it
    is stored, :meth:`commit` (which frees the previous version's state).

    Not thread-safe: one encoder per session, used by one writer at a time.
    """

    def __init__(
        self,
        *,
        policy: ChainPolicy = DEFAULT_POLICY,
        compact_message_type: type[_message.Message] | None = None,
        compact_min_saving_ratio: float = 0.1,
        format_version: int = FORMAT_VERSION,
    ) -> None:
        if not isinstance(policy, ChainPolicy):
            raise TypeError(f"policy must be a ChainPolicy, not {type(policy).__name__}")
        _check_compaction(compact_message_type, compact_min_saving_ratio)
        check_format_version(format_version)
        self._policy = policy
        # Format 1 is for compatibility tests and tools; a chain may mix both
        # (an encoder resumed on a format 1 chain appends format 2 frames).
        self._format = format_version
        self._compact_type = compact_message_type
        self._compact_min_saving = compact_min_saving_ratio
        self._version = 0
        # The head state as chunks: the last FULL/REPLACE state, then each
        # MERGE patch since. Appending keeps a merge O(patch); see StateSnapshot.
        self._chunks: list[bytes] = []
        self._state_size = 0
        self._hasher = xxhash.xxh3_64()
        self._chain = ChainStats()
        self._stream: _Stream | None = None
        self._undo: _Undo | None = None
        # What the head state compacted to when last measured (or the size of a state
        # that was whole: a FULL frame's, a REPLACE's): see ChainPolicy.max_superseded_fraction.
        self._live_size = 0

    @classmethod
    def resume(
        cls,
        state: bytes,
        chain: Sequence[FrameHeader],
        *,
        policy: ChainPolicy = DEFAULT_POLICY,
        compact_message_type: type[_message.Message] | None = None,
        compact_min_saving_ratio: float = 0.1,
        format_version: int = FORMAT_VERSION,
    ) -> ChainEncoder:
        """An encoder continuing a stored session whose head has ``state``.

        ``chain`` is the headers of the head's chain, FULL frame first. The
        first frame it writes starts a new zstd stream (the old one is gone).
        """
        state = _as_bytes(state, "state")
        if not chain:
            raise ValueError("resume needs the head's chain; use ChainEncoder() for a new session")
        head = chain[-1]
        if len(state) != head.state_size or state_checksum(state) != head.state_xxh3:
            raise ValueError(
                f"state of {len(state)} bytes is not the head state of version {head.version}"
                f" ({head.state_size} bytes, xxh3 {head.state_xxh3:#018x})"
            )
        enc = cls(
            policy=policy,
            compact_message_type=compact_message_type,
            compact_min_saving_ratio=compact_min_saving_ratio,
            format_version=format_version,
        )
        enc._version = head.version
        enc._set_state(bytes(state))
        enc._hasher = xxhash.xxh3_64(state)
        enc._chain = ChainStats.of(chain)
        # The last whole state of the chain: what MERGE patches since may have superseded.
        enc._live_size = next(h.state_size for h in reversed(chain) if h.kind is not FrameKind.PATCH)
        return enc

    # -- what the encoder holds -------------------------------------------

    @property
    def version(self) -> int:
        """Version of the head (0 before the first frame)."""
        return self._version

    @property
    def state(self) -> bytes:
        """The head state."""
        return self._head_bytes()

    @property
    def state_size(self) -> int:
        return self._state_size

    @property
    def state_xxh3(self) -> int:
        """XXH3-64 of the head state (what its frame header records), without hashing the state again."""
        return self._hasher.intdigest()

    @property
    def memory_bytes(self) -> int:
        """Estimated memory this encoder keeps: the head state, its live zstd stream, and
        until :meth:`commit` the previous version's state that :meth:`rollback` would restore
        (a whole state after a REPLACE or a new chain; a MERGE within a chain shares it)."""
        stream = self._stream
        undo = self._undo
        kept = undo.state_size if undo is not None and undo.chunks is not self._chunks else 0
        return self._state_size + kept + (stream.memory_bytes if stream is not None else 0)

    def snapshot(self) -> StateSnapshot:
        """The head state, without copying it now: see :class:`StateSnapshot`."""
        return StateSnapshot(self._chunks, len(self._chunks), self._state_size)

    @property
    def chain(self) -> ChainStats:
        return self._chain

    @property
    def policy(self) -> ChainPolicy:
        return self._policy

    @property
    def format_version(self) -> int:
        """The frame format this encoder writes."""
        return self._format

    # -- writes -------------------------------------------------------------

    def replace(self, state: Buffer) -> EncodedFrame:
        """Frame for a REPLACE write: ``state`` is the whole new state."""
        state = _as_bytes(state, "state")
        _check_size(len(state), self._version + 1)
        hasher = xxhash.xxh3_64(state)
        self._save_undo()
        try:
            if not self._version or self._new_chain_needed(len(state), len(state), delta=True):
                return self._full(state, hasher)
            base_size = self._state_size
            stream = self._stream
            if stream is None or (1 << stream.window_log) < stream.fed + len(state):
                prefix = self._head_bytes() if base_size >= MIN_PREFIX_SIZE else b""
                room = _ROOM_STATES * len(state) if len(state) <= self._policy.small_state_bytes else 0
                cover = len(prefix) + len(state) + room
                stream = self._start_stream(cover_bytes=cover, index_bytes=max(len(prefix), len(state)), prefix=prefix)
                continues, prefix_size = False, len(prefix)
            else:
                continues, prefix_size = True, 0
            payload = stream.compressor.compress(state, _zstd.FLUSH_BLOCK)
            stream.fed += len(state)
            if not self._clearly_smaller(len(payload), len(state)):
                return self._full(state, hasher)
            header = self._delta_header(FrameKind.DELTA, len(state), hasher, len(payload), prefix_size, continues)
            self._set_state(state)
            self._live_size = len(state)
            return self._advance(header, payload, hasher, base_index=len(self._chain.path) - 1)
        except BaseException:
            self.rollback()
            raise

    def merge(self, patch: Buffer, *, checked: bool = False, max_state_size: int | None = None) -> EncodedFrame:
        """Frame for a MERGE write: new state = head state + ``patch``.

        ``patch`` must be well-formed protobuf wire format (and parse as the
        compaction message type, when one is configured); otherwise
        WireFormatError names the offending offset and nothing changes.
        ``checked=True`` skips that check: for callers that already ran
        :func:`check_patch` with the same message type (off the thread that
        owns the encoder, say).

        ``max_state_size``: the largest state the caller keeps. A merge past it
        is stored compacted (a FULL frame of the canonical state: the fields
        the patch overwrites dropped) if that fits, else MergeTooLargeError.
        """
        patch = _as_bytes(patch, "patch")
        if not checked:
            check_patch(patch, message_type=self._compact_type)
        new_size = self._state_size + len(patch)
        fitted = None  # the canonical state, stored whole, of a merge over max_state_size
        if max_state_size is not None and new_size > max_state_size:
            fitted = self._fitted(patch, new_size, max_state_size)
        _check_size(new_size if fitted is None else len(fitted), self._version + 1)
        hasher = self._hasher.copy()
        hasher.update(patch)
        self._save_undo()
        try:
            if fitted is not None:
                return self._full(fitted, xxhash.xxh3_64(fitted))
            if self._compact_type is not None and self._version and self._superseded_check_due(new_size):
                canonical = self._compacted(self._head_bytes() + patch)
                if len(canonical) <= (1.0 - self._policy.max_superseded_fraction) * new_size:
                    return self._full(canonical, xxhash.xxh3_64(canonical))
                self._live_size = len(canonical)
            ends, base_index = merge_plan(self._policy, self._chain, len(patch)) if self._version else (True, 0)
            if ends:
                state = self._head_bytes() + patch
                if self._compact_type is not None:
                    canonical = self._compacted(state)
                    if len(canonical) <= (1.0 - self._compact_min_saving) * len(state):
                        state, hasher = canonical, xxhash.xxh3_64(canonical)
                return self._full(state, hasher)
            if base_index != len(self._chain.path) - 1 and self._format != 1:
                return self._segment(patch, new_size, hasher, base_index)
            stream = self._stream
            if stream is None:
                window = self._policy.patch_window_bytes
                prefix = self._head_bytes()[-window:] if window else b""
                if len(prefix) < MIN_PREFIX_SIZE:
                    prefix = b""
                stream = self._start_stream(
                    cover_bytes=2 * (len(prefix) + len(patch)), index_bytes=len(prefix) + len(patch), prefix=prefix
                )
                continues, prefix_size = False, len(prefix)
            else:
                continues, prefix_size = True, 0
            payload = stream.compressor.compress(patch, _zstd.FLUSH_BLOCK)
            stream.fed += len(patch)
            if not self._clearly_smaller(len(payload), new_size):
                return self._full(self._head_bytes() + patch, hasher)
            header = self._delta_header(FrameKind.PATCH, new_size, hasher, len(payload), prefix_size, continues)
            self._chunks.append(patch)
            self._state_size = new_size
            return self._advance(header, payload, hasher, base_index=base_index)
        except BaseException:
            self.rollback()
            raise

    def _segment(self, patch: bytes, new_size: int, hasher: xxhash.xxh3_64, base_index: int) -> EncodedFrame:
        """A segment frame (FORMAT.md §14): every patch since ``path[base_index]`` and ``patch``, in a new
        stream that references the end of the base's state."""
        base = self._chain.path[base_index]
        content = self._state_range(base.state_size, self._state_size) + patch
        window = self._policy.patch_window_bytes
        prefix = self._state_range(max(0, base.state_size - window), base.state_size) if window else b""
        if len(prefix) < MIN_PREFIX_SIZE:
            prefix = b""
        cover = len(prefix) + len(content)
        stream = self._start_stream(cover_bytes=2 * cover, index_bytes=cover, prefix=prefix)
        payload = stream.compressor.compress(content, _zstd.FLUSH_BLOCK)
        stream.fed += len(content)
        if not self._clearly_smaller(len(payload), new_size):
            return self._full(self._head_bytes() + patch, hasher)
        header = FrameHeader(
            kind=FrameKind.PATCH,
            version=self._version + 1,
            base_version=base.version,
            state_size=new_size,
            base_size=base.state_size,
            payload_size=len(payload),
            prefix_size=len(prefix),
            state_xxh3=hasher.intdigest(),
            base_xxh3=0,
            window_log=stream.window_log,
            continues_stream=False,
            format=self._format,
        )
        self._chunks.append(patch)
        self._state_size = new_size
        return self._advance(header, payload, hasher, base_index=base_index)

    def _fitted(self, patch: bytes, new_size: int, limit: int) -> bytes:
        """The canonical state of a merge of ``patch`` whose merged state (``new_size``) is over ``limit``, if
        it fits; else MergeTooLargeError. A state rewritten by MERGEs repeats the fields each patch
        overwrites until a frame compacts it: a large field written again fills the limit long before the
        message does."""
        if self._compact_type is None or not self._version:
            raise MergeTooLargeError(
                f"merging {len(patch)} bytes onto version {self._version} would make a state of {new_size} bytes;"
                f" the limit is {limit}",
                version=self._version + 1, state_size=new_size, limit=limit,
            )  # fmt: skip
        canonical = self._compacted(self._head_bytes() + patch)
        if len(canonical) > limit:
            raise MergeTooLargeError(
                f"merging {len(patch)} bytes onto version {self._version} would make a state of {len(canonical)}"
                f" bytes (compacted, {new_size} as merged); the limit is {limit}",
                version=self._version + 1, state_size=len(canonical), limit=limit,
            )  # fmt: skip
        return canonical

    def rollback(self) -> None:
        """Forget the last frame produced (it was not stored).

        The head goes back to the previous version. The live stream is dropped
        because it has already consumed the forgotten content; the next frame
        starts a new stream.
        """
        undo = self._undo
        if undo is None:
            return
        self._undo = None
        self._stream = None
        self._version = undo.version
        # Only the forgotten frame's chunk goes; snapshots never cover it.
        self._chunks = undo.chunks
        del self._chunks[undo.chunk_count :]
        self._state_size = undo.state_size
        self._hasher = undo.hasher
        self._chain = undo.chain

    def release_stream(self) -> None:
        """Free the live zstd stream (most of a large state's encoder: a 150 MB state's FULL frame opens a
        512 MiB window); the next frame starts a new one, as an encoder resumed on the chain would."""
        self._stream = None

    def commit(self) -> None:
        """Confirm the last frame was stored: :meth:`rollback` no longer undoes it.

        Releases what rollback would have restored. After a REPLACE (or any
        frame that starts a new chain) that is the previous version's whole
        state: an encoder kept until its next write held two states, 8-15% more
        than it counted for 300 KB-1 MB states (RSS over 40-version chains).
        """
        self._undo = None

    # -- internals ----------------------------------------------------------

    def _save_undo(self) -> None:
        self._undo = _Undo(self._version, self._chunks, len(self._chunks), self._state_size, self._hasher, self._chain)

    def _set_state(self, state: bytes) -> None:
        # A new list: snapshots of earlier versions keep the old one.
        self._chunks = [state]
        self._state_size = len(state)

    def _head_bytes(self) -> bytes:
        chunks = self._chunks
        if len(chunks) == 1:
            return chunks[0]
        joined = b"".join(chunks)
        # Joined once per chain at most: later frames append to this one chunk.
        self._chunks = [joined]
        return joined

    def _state_range(self, start: int, stop: int) -> bytes:
        # Bytes start..stop of the head state, without joining the chunks (a large state's, a copy of it
        # every segment) outside them.
        parts, at = [], 0
        for chunk in self._chunks:
            end = at + len(chunk)
            if end > start and at < stop:
                parts.append(chunk[max(start - at, 0) : min(stop, end) - at])
            at = end
            if at >= stop:
                break
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _superseded_check_due(self, new_state_size: int) -> bool:
        fraction = self._policy.max_superseded_fraction
        return fraction < 1.0 and new_state_size * (1.0 - fraction) > self._live_size

    def _compacted(self, state: bytes) -> bytes:
        assert self._compact_type is not None
        try:
            return compact(state, self._compact_type)
        except EncodeError:
            # The patch parses (merge() checked it), so the head does not: a
            # REPLACE of another type. It stays as it is.
            return state

    def _new_chain_needed(self, new_state_size: int, content_size: int, *, delta: bool) -> bool:
        return chain_ends(self._policy, self._chain, new_state_size, content_size, delta=delta) or (
            self._version + 1 - self._chain.start_version >= self._policy.max_chain_versions
        )

    def _clearly_smaller(self, payload_size: int, new_state_size: int) -> bool:
        estimated_full = self._chain.full_ratio * new_state_size
        return payload_size <= self._policy.max_delta_to_full_ratio * estimated_full

    def _stream_logs(self, cover_bytes: int, index_bytes: int) -> tuple[int, int]:
        """The (window_log, table_log) of a stream covering ``cover_bytes`` and indexing ``index_bytes``."""
        # The window covers the prefix and room to grow, so later frames of
        # the stream still reach the state they are a delta against. The match
        # tables only need to index about one state: a frame mostly references
        # the version just before it (see _zstd.new_stream).
        return max(self._policy.min_window_log, _zstd.window_log_for(cover_bytes)), _zstd.table_log_for(index_bytes)

    def _start_stream(self, *, cover_bytes: int, index_bytes: int, prefix: bytes) -> _Stream:
        window_log, table_log = self._stream_logs(cover_bytes, index_bytes)
        old = self._stream
        if (
            not prefix
            and old is not None
            and old.prefix_free
            and old.window_log == window_log
            and old.table_log == table_log
        ):
            # End the old chain's frame (those bytes are never stored) and start
            # the new one on the same context: a fresh compressor costs ~15 us
            # more per chain, allocating and faulting in its match tables.
            old.compressor.compress(b"", _zstd.ZstdCompressor.FLUSH_FRAME)
            old.fed = 0
            return old
        compressor = _zstd.new_stream(
            level=self._policy.level, window_log=window_log, table_log=table_log, prefix=prefix or None
        )
        memory = _zstd.stream_memory_bytes(window_log=window_log, table_log=table_log, prefix_size=len(prefix))
        self._stream = _Stream(compressor, window_log, table_log, memory, prefix_free=not prefix, fed=len(prefix))
        return self._stream

    def _full(self, state: bytes, hasher: xxhash.xxh3_64, *, sealed: bool = False) -> EncodedFrame:
        if sealed:  # the stream's window, tables and level, in one zstd frame that ends (FORMAT.md §13)
            window_log, table_log = self._stream_logs(2 * len(state), len(state))  # as _full's stream's
            compressor = _zstd.new_stream(
                level=self._policy.level, window_log=window_log, table_log=table_log, prefix=None, sealed=True
            )
            payload = compressor.compress(state, _zstd.ZstdCompressor.FLUSH_FRAME)
            self._stream = None  # no frame continues it
        else:
            stream = self._start_stream(cover_bytes=2 * len(state), index_bytes=len(state), prefix=b"")
            payload = stream.compressor.compress(state, _zstd.FLUSH_BLOCK)
            stream.fed += len(state)
            window_log = stream.window_log
        header = FrameHeader(
            kind=FrameKind.FULL,
            version=self._version + 1,
            base_version=0,
            state_size=len(state),
            base_size=0,
            payload_size=len(payload),
            prefix_size=0,
            state_xxh3=hasher.intdigest(),
            base_xxh3=0,
            window_log=window_log,
            continues_stream=False,
            format=self._format,
            sealed=sealed,
        )
        self._set_state(state)
        self._live_size = len(state)
        self._chain = started(header, len(payload))
        return self._advance(header, payload, hasher, base_index=-1)

    def _delta_header(
        self,
        kind: FrameKind,
        state_size: int,
        hasher: xxhash.xxh3_64,
        payload_size: int,
        prefix_size: int,
        continues: bool,
    ) -> FrameHeader:
        assert self._stream is not None
        return FrameHeader(
            kind=kind,
            version=self._version + 1,
            base_version=self._version,
            state_size=state_size,
            base_size=self._state_size,
            payload_size=payload_size,
            prefix_size=prefix_size,
            state_xxh3=hasher.intdigest(),
            base_xxh3=self._hasher.intdigest() if self._format == 1 else 0,
            window_log=self._stream.window_log,
            continues_stream=continues,
            format=self._format,
        )

    def _advance(self, header: FrameHeader, payload: bytes, hasher: xxhash.xxh3_64, *, base_index: int) -> EncodedFrame:
        """The frame of ``header``, now the head: based on ``self._chain.path[base_index]`` (-1: a FULL frame,
        whose stats are set already)."""
        self._version = header.version
        self._hasher = hasher
        if base_index >= 0:
            self._chain = self._chain.after(header, base_index)
        return EncodedFrame(header, write(header, payload))


def _check_compaction(message_type: object, min_saving_ratio: object) -> None:
    if message_type is not None and not (isinstance(message_type, type) and issubclass(message_type, _message.Message)):
        raise TypeError(f"compact_message_type must be a protobuf message class or None, got {message_type!r}")
    if not isinstance(min_saving_ratio, (int, float)) or isinstance(min_saving_ratio, bool):
        raise TypeError(
            f"compact_min_saving_ratio must be a number, got {type(min_saving_ratio).__name__} {min_saving_ratio!r}"
        )
    if not 0.0 <= min_saving_ratio < 1.0:
        raise ValueError(f"compact_min_saving_ratio must be in [0, 1), got {min_saving_ratio}")


def _as_bytes(value: object, name: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{name} must be bytes, not {type(value).__name__}")


def _check_size(size: int, version: int) -> None:
    if size > MAX_STATE_SIZE:
        raise EncodeError(f"state of version {version} would be {size} bytes; the frame format allows {MAX_STATE_SIZE}")
