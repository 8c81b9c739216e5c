"""What every frame format shares: kinds, the decoded header, and the rules between its fields.

The byte layouts live in frame_v1 (64-byte fixed header) and frame_v2
(varints); both parse into the same FrameHeader (see FORMAT.md).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import NamedTuple

import xxhash

from .errors import UnsupportedFormatError

#: The format pack() and the encoder write.
FORMAT_VERSION = 2
#: Every format this codec reads; none is ever dropped.
READABLE_FORMATS = (1, 2)
V1_HEADER_SIZE = 64
MAX_STATE_SIZE = 0xFFFF_FFFF  # what the encoder writes; protobuf messages stop at 2 GiB anyway
# zstd APIs (the stdlib's ZstdDict among them) refuse dictionaries and prefixes
# under 8 bytes; a base that short is referenced by no prefix at all.
MIN_PREFIX_SIZE = 8
# The most a zstd payload can decompress to, per payload byte: a block yields
# at most 128 KiB (zstd's Block_Maximum_Size) and takes at least 4 bytes (a
# 3-byte block header and the byte of an RLE block). Each frame's payload
# yields its own content (the writer flushes a block per frame), so a header
# declaring more content than this times its payload size cannot be right.
MAX_EXPANSION = 128 * 1024 // 4
# v2's fixed parts: magic, format, kind_flags, window_log before the varints;
# state_xxh3 (8) and frame_check (4) after them.
V2_HEAD_BYTES = 5
V2_TAIL_BYTES = 12


class FrameKind(enum.IntEnum):
    """How a frame's payload turns into its version's state."""

    FULL = 1  # zstd(state); starts a chain
    DELTA = 2  # zstd(state) referencing the base state
    PATCH = 3  # zstd(patch); state = base state + patch
    #: No payload: the state is the first state_size bytes of a NEWER version's state (base_version, the
    #: source). Format 2 only, where its kind number is 0; its value here is the proto enum's
    #: FRAME_KIND_PREFIX, so that a kind stored by value reads back as this kind.
    PREFIX = 4


#: Format 2's kind numbers (kind_flags bits 0-1), both ways; format 1's kind byte is FULL, DELTA, PATCH only.
KINDS_BY_NUMBER = {0: FrameKind.PREFIX, 1: FrameKind.FULL, 2: FrameKind.DELTA, 3: FrameKind.PATCH}
KIND_NUMBERS = {kind: number for number, kind in KINDS_BY_NUMBER.items()}
V1_KINDS_BY_NUMBER = {1: FrameKind.FULL, 2: FrameKind.DELTA, 3: FrameKind.PATCH}


class FrameHeader(NamedTuple):
    """The decoded header of one frame, whatever its format.

    A NamedTuple rather than a frozen dataclass: tuple construction is several
    times cheaper, and a header is built per frame parsed or written.
    """

    kind: FrameKind
    version: int
    base_version: int
    state_size: int
    base_size: int
    payload_size: int
    prefix_size: int
    state_xxh3: int
    #: xxh3 of the base state; format 1 only (0 in a format 2 header, which
    #: leaves a wrong base to the produced state's xxh3).
    base_xxh3: int
    window_log: int
    continues_stream: bool
    #: The frame format the header was read from or is to be written in.
    format: int = FORMAT_VERSION
    #: A sealed FULL frame (format 2 only, FORMAT.md §13): its payload is one whole zstd frame declaring
    #: its content size, and no frame continues its stream.
    sealed: bool = False

    @property
    def content_size(self) -> int:
        """Bytes the payload decompresses to: the state, for PATCH the patch, for PREFIX nothing."""
        kind = self.kind
        if kind is FrameKind.PATCH:
            return self.state_size - self.base_size
        return 0 if kind is FrameKind.PREFIX else self.state_size

    @property
    def header_size(self) -> int:
        if self.format == 1:
            return V1_HEADER_SIZE
        varints = (
            self.version,
            base_distance(self),
            self.state_size,
            self.base_size,
            self.prefix_size,
            self.payload_size,
        )
        return V2_HEAD_BYTES + sum(varint_size(v) for v in varints) + V2_TAIL_BYTES

    @property
    def frame_size(self) -> int:
        return self.header_size + self.payload_size


def base_distance(h: FrameHeader) -> int:
    """Format 2's ``base_distance`` of a header: 0 for FULL, how much newer the source is for PREFIX, how
    much older the base is otherwise."""
    if h.kind is FrameKind.FULL:
        return 0
    return h.base_version - h.version if h.kind is FrameKind.PREFIX else h.version - h.base_version


def check_format_version(value: object, name: str = "format_version") -> int:
    """``value`` if it is a format this codec reads and writes; TypeError or ValueError naming ``name`` otherwise."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value not in READABLE_FORMATS:
        raise ValueError(f"{name} must be one of {READABLE_FORMATS}, got {value!r}")
    return value


def varint_size(value: int) -> int:
    """Bytes of the minimal unsigned LEB128 encoding of ``value``."""
    return max(1, (value.bit_length() + 6) // 7)


def state_checksum(state: bytes | bytearray | memoryview) -> int:
    """xxh3-64 (seed 0) of a state, as stored in ``state_xxh3``."""
    return xxhash.xxh3_64_intdigest(state)


def as_bytes_view(frame: bytes | bytearray | memoryview) -> memoryview:
    """A flat view of a frame's bytes, whatever the shape of the buffer given.

    Raises TypeError for an object that is not a buffer, or one that is not
    C-contiguous.
    """
    view = memoryview(frame)
    if view.itemsize != 1 or view.ndim != 1 or not view.c_contiguous:
        if not view.c_contiguous:
            raise TypeError("a frame must be a C-contiguous buffer (bytes, bytearray or memoryview)")
        view = view.cast("B")
    return view


def check_fields(h: FrameHeader) -> None:
    """Raise UnsupportedFormatError naming the first field that breaks the rules between fields."""
    if not _fields_look_valid(h):
        _raise_for_fields(h)


def _fields_look_valid(h: FrameHeader) -> bool:
    """The common case of _raise_for_fields as one expression (it runs once per frame)."""
    if not (10 <= h.window_log <= 31 and h.version >= 1):
        return False
    if h.content_size > MAX_EXPANSION * h.payload_size:
        return False
    if h.kind is FrameKind.FULL:
        return not (
            h.base_version
            or h.base_size
            or h.prefix_size
            or h.base_xxh3
            or h.continues_stream
            or (h.sealed and h.format != 2)
        )
    if h.sealed or h.base_version != h.version - 1:
        return False
    if h.continues_stream:
        return h.prefix_size == 0 and (
            h.kind is FrameKind.DELTA or (h.kind is FrameKind.PATCH and h.state_size >= h.base_size)
        )
    return False  # stream starts are rare: let the full check decide


def _raise_for_fields(h: FrameHeader) -> None:
    def bad(what: str) -> UnsupportedFormatError:
        return UnsupportedFormatError(
            f"inconsistent {h.kind.name} frame header for version {h.version} (format {h.format}): {what}"
        )

    if not 10 <= h.window_log <= 31:
        raise bad(f"window_log {h.window_log} outside 10..31")
    if h.version < 1:
        raise bad("version 0 (versions start at 1)")
    if h.sealed and h.format != 2:
        raise bad("the SEALED flag: format 1 has none")
    if h.sealed and h.kind is not FrameKind.FULL:
        raise bad(f"the SEALED flag on a {h.kind.name} frame: only a FULL frame may end its stream")
    if h.kind is FrameKind.FULL:
        for name in ("base_version", "base_size", "prefix_size", "base_xxh3", "continues_stream"):
            if getattr(h, name):
                raise bad(f"{name} {getattr(h, name)}: a FULL frame has no base, prefix or stream to continue")
    elif h.kind is FrameKind.PREFIX:
        _check_prefix_fields(h, bad)
    else:
        if h.kind is FrameKind.PATCH and h.format == 2 and 1 <= h.base_version < h.version - 1:
            if h.continues_stream:  # a segment (FORMAT.md §14) starts its stream
                raise bad(f"base_version {h.base_version} (a segment) on a frame that continues a stream")
        elif h.base_version != h.version - 1:
            raise bad(f"base_version {h.base_version} is not version - 1")
        if h.continues_stream and h.prefix_size:
            raise bad(f"prefix_size {h.prefix_size} on a frame that continues a stream")
        if 0 < h.prefix_size < MIN_PREFIX_SIZE:
            raise bad(f"prefix_size {h.prefix_size} is neither 0 nor >= {MIN_PREFIX_SIZE}")
        if h.kind is FrameKind.DELTA and h.prefix_size not in (0, h.base_size):
            raise bad(f"prefix_size {h.prefix_size} is neither 0 nor base_size {h.base_size}")
        if h.kind is FrameKind.PATCH:
            if h.state_size < h.base_size:
                raise bad(f"state_size {h.state_size} < base_size {h.base_size}")
            if h.prefix_size > h.base_size:
                raise bad(f"prefix_size {h.prefix_size} > base_size {h.base_size}")
    if h.content_size > MAX_EXPANSION * h.payload_size:
        raise bad(
            f"a {h.payload_size}-byte payload cannot decompress to {h.content_size} bytes"
            f" (zstd yields at most {MAX_EXPANSION} bytes per payload byte)"
        )


def _check_prefix_fields(h: FrameHeader, bad: Callable[[str], UnsupportedFormatError]) -> None:
    if h.format != 2:
        raise bad("format 1 has no PREFIX kind")
    if h.base_version <= h.version:
        raise bad(f"source version {h.base_version} is not newer than version {h.version}")
    if h.state_size > h.base_size:
        raise bad(f"state_size {h.state_size} > base_size {h.base_size} (a prefix of the source's state)")
    for name in ("prefix_size", "payload_size", "base_xxh3", "continues_stream"):
        if getattr(h, name):
            raise bad(f"{name} {getattr(h, name)}: a PREFIX frame has no payload, stream or zstd prefix")
