"""Frames between the sidecar's gRPC process and its store process (sans-IO).

The sidecar's gRPC process forwards each CheckpointService call's request
bytes to a child process that owns the Store and runs the CheckpointService
on it, and answers with the reply's bytes. The point is the GIL: the store's
writer thread and the gRPC event loop do not take turns on one (unary
merges/s were 1.3-1.6x those of one process serving both, on 2 cores).

A frame is a 16-byte header (little-endian: kind u8, method u8, status u8, a
zero byte, tag u32, meta length u32, body length u32), the meta (UTF-8 JSON:
what a failed call's status carries, a handshake's facts) and the body (a
request's or reply's bytes). This module does no I/O: the two processes feed
it bytes and write what it encodes.
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from ..errors import StoreError

_HEADER = struct.Struct("<BBBxIII")
HEADER_BYTES = _HEADER.size
#: The largest tag a frame can carry (a u32); the gRPC process's count of calls wraps past it.
MAX_TAG = 2**32 - 1


class Kind(enum.IntEnum):
    #: gRPC process -> store process: ``tag`` names the call, ``method`` the
    #: CheckpointService method (an index of methods.UNARY_METHODS) or a server
    #: extension's (numbered down from methods.LAST_LINK_METHOD), the body is the request.
    CALL = 1
    #: store -> gRPC: the call ``tag`` ended; status 0 and the reply's bytes,
    #: or a gRPC status code with meta {"details": str, "trailers": [[k, v], ...]}.
    REPLY = 2
    #: store -> gRPC, once, first: serving; meta {"metrics_address": str | None}.
    READY = 3
    #: store -> gRPC, once, instead of READY: it could not start; meta {"error": str}.
    FAILED = 4
    #: gRPC -> store: no more calls will come; finish those under way, close the store, exit.
    CLOSE = 5
    #: store -> gRPC: a commit failed and the store takes no more writes; meta {"reason": str}.
    WRITES_STOPPED = 6
    #: gRPC -> store: a PutStream ``tag`` opened.
    STREAM_OPEN = 7
    #: store -> gRPC: stream ``tag``'s handler reads its next message (one per WANT: the
    #: store's read-ahead bound holds the client back through gRPC's flow control).
    STREAM_WANT = 8
    #: gRPC -> store: the message a WANT asked for (the body: a PutStreamRequest's bytes).
    STREAM_IN = 9
    #: gRPC -> store: the client sent its last message (the answer to a WANT).
    STREAM_HALF_CLOSE = 10
    #: gRPC -> store: the client went away (or the call was cancelled).
    STREAM_CANCEL = 11
    #: store -> gRPC: a PutStreamResponse's bytes for stream ``tag``.
    STREAM_OUT = 12
    #: store -> gRPC: stream ``tag`` ended: status 0, or a status with meta as REPLY's.
    STREAM_END = 13
    #: gRPC -> store: the sidecar is stopping: streams answer what they read and end UNAVAILABLE.
    STOP_STREAMS = 14
    #: gRPC -> store: the gRPC process answered a call of ``method`` itself (a Get from its reply
    #: cache), for the store process's metrics; meta {"calls": [[method, seconds, state_bytes, cached], ...]},
    #: "blobs": [[rpc, code, seconds], ...], the blob calls it served (PutBlob, GetBlob) and the name of the
    #: status each ended with, and "store_full": [error, ...], writes it refused for want of disk space (a
    #: PutBlob's bytes).
    SERVED = 15
    #: gRPC -> store: the gRPC process's own gauges, for the store process's metrics;
    #: meta {"reply_cache_bytes": int, "reply_cache_entries": int}.
    GAUGES = 16


_KINDS = {kind.value: kind for kind in Kind}


class LinkError(StoreError):
    """The bytes on the link are not frames (a bug, or a process that died mid-write)."""


#: The meta of a frame that carries none (read-only: one shared instance).
NO_META: Mapping[str, Any] = MappingProxyType({})


class Frame(NamedTuple):
    """One frame. A NamedTuple rather than a frozen dataclass: a unary merge makes four (a call and its
    reply, written and read), and the frozen dataclass's init cost ~2 us each against ~0.5."""

    kind: Kind
    tag: int = 0
    method: int = 0
    status: int = 0
    meta: Mapping[str, Any] = NO_META
    body: bytes = b""


def encode(frame: Frame) -> bytes:
    return b"".join(encode_parts(frame))


#: Bodies from this size on are written apart from their header, not copied to join it.
_JOIN_BELOW_BYTES = 64 * 1024


def encode_parts(frame: Frame) -> tuple[bytes, ...]:
    """The frame's bytes to write in turn: one piece, or header and meta then a large body (not copied to
    join them; a small one is joined, as each piece may cost the event loop a write of its own)."""
    meta = json.dumps(frame.meta, separators=(",", ":")).encode() if frame.meta else b""
    header = _HEADER.pack(frame.kind, frame.method, frame.status, frame.tag, len(meta), len(frame.body))
    if len(frame.body) < _JOIN_BELOW_BYTES:
        return (header + meta + frame.body,)
    return header + meta, frame.body


class FrameWriter:
    """Frames queued during one event-loop turn, written together at its end.

    A group commit answers many calls in one turn, and gRPC hands over many
    calls in one: one write (one syscall, one wake-up of the other process)
    for all of them, instead of one each. A frame with a large body is
    written at once, behind what is queued. ``schedule`` runs its argument
    after what the loop has ready (``loop.call_soon``); ``write`` takes the
    pieces to write in order (``transport.writelines``).
    """

    def __init__(
        self, write: Callable[[list[bytes]], object], schedule: Callable[[Callable[[], None]], object]
    ) -> None:
        self._write = write
        self._schedule = schedule
        self._parts: list[bytes] = []

    def send(self, frame: Frame) -> None:
        parts = encode_parts(frame)
        if len(parts) > 1:  # a large body (a hot Get's state): not held back a turn, nor copied to join
            self._parts.extend(parts)
            self.flush()
            return
        if not self._parts:
            self._schedule(self.flush)
        self._parts.extend(parts)

    def flush(self) -> None:
        """Write what is queued now (also before closing the transport: what is queued would be lost)."""
        if self._parts:
            parts, self._parts = self._parts, []
            self._write(parts)


class FrameReader:
    """Frames out of a byte stream fed in pieces of any size.

    A large body (from ``large_body_bytes`` on) that is still arriving is kept
    as the pieces it arrives in and joined once complete: gathering it in the
    read buffer and then copying it out cost ~350 us for a 300 KB body here
    (each fresh allocation of that size faults its pages in), several times
    what the join costs.
    """

    def __init__(self, *, max_frame_bytes: int, large_body_bytes: int = _JOIN_BELOW_BYTES) -> None:
        self._max_frame_bytes = max_frame_bytes
        self._large_body_bytes = large_body_bytes
        self._buffer = bytearray()
        #: The large frame under way: its fields but the body, the body's pieces so far, and what is missing.
        self._large: tuple[Kind, int, int, int, Mapping[str, Any]] | None = None
        self._large_pieces: list[bytes | memoryview] = []
        self._large_missing = 0

    def feed(self, data: bytes) -> list[Frame]:
        """The frames ``data`` completes, in order (those still partial wait for more)."""
        frames: list[Frame] = []
        rest = memoryview(data)
        if self._large is not None:
            if len(data) < self._large_missing:
                self._large_pieces.append(rest)
                self._large_missing -= len(data)
                return frames
            taken = self._large_missing
            self._large_pieces.append(rest[:taken])
            frames.append(Frame(*self._large, b"".join(self._large_pieces)))
            self._large, self._large_pieces, self._large_missing = None, [], 0
            rest = rest[taken:]
        buffer = self._buffer
        # Frames are read from ``data`` itself unless a partial one waits in the buffer: what is
        # left over goes to the buffer (copying every read into it first cost a copy of each body).
        source: bytearray | memoryview
        if buffer:
            buffer += rest
            source = buffer
        else:
            source = rest
        offset = 0  # consumed bytes at the source's start
        end = len(source)
        kinds = _KINDS
        with memoryview(source) as view:  # one copy of a body (a slice of the bytearray would be two)
            while end - offset >= HEADER_BYTES:
                number, method, status, tag, meta_size, body_size = _HEADER.unpack_from(view, offset)
                size = HEADER_BYTES + meta_size + body_size
                if meta_size + body_size > self._max_frame_bytes:
                    raise LinkError(
                        f"a link frame at offset {offset} declares {meta_size + body_size} bytes;"
                        f" the limit is {self._max_frame_bytes}"
                    )
                kind = kinds.get(number)
                if kind is None:
                    raise LinkError(f"a link frame at offset {offset} has an unknown kind {number}")
                start = offset + HEADER_BYTES
                body_at = start + meta_size
                complete = end - offset >= size
                if not complete and (body_size < self._large_body_bytes or end < body_at):
                    break
                try:
                    meta = json.loads(bytes(view[start:body_at])) if meta_size else NO_META
                except ValueError as exc:
                    raise LinkError(f"a link frame at offset {offset} has meta that is not JSON: {exc}") from None
                if not complete:  # a large body under way: its pieces from here on are kept as they come
                    self._large = (kind, tag, method, status, meta)
                    # A view of ``data`` (immutable) costs no copy; the buffer is reused, so not of it.
                    piece = bytes(view[body_at:end]) if source is buffer else rest[body_at:end]
                    self._large_pieces = [piece]
                    self._large_missing = body_size - (end - body_at)
                    offset = end
                    break
                frames.append(Frame(kind, tag, method, status, meta, bytes(view[body_at : offset + size])))
                offset += size
            if source is not buffer and offset < end:
                buffer += view[offset:end]
        if source is buffer:
            del buffer[:offset]
        return frames
