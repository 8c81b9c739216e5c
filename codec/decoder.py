"""Turn a chain of frames back into states, verifying every link and checksum."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from . import _zstd
from .errors import ChainLinkError, ChecksumError, DecodeError, StateTooLargeError
from .frame import (
    CHECKSUM,
    FLAG_CONTINUES_STREAM,
    FORMAT_VERSION,
    HEAD,
    HEADER_SIZE,
    KINDS_BY_NUMBER,
    MAGIC,
    MAX_EXPANSION,
    FrameHeader,
    FrameKind,
    as_bytes_view,
    frame_checksum,
    parse,
    state_checksum,
)

FrameBytes = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class DecodedVersion:
    header: FrameHeader
    state: bytes

    @property
    def version(self) -> int:
        return self.header.version


def decode(frames: Iterable[FrameBytes], *, max_state_bytes: int | None = None) -> bytes:
    """Return the state of the last frame of a chain (FULL frame first).

    Every frame's checksum and base link is verified, and the result's size
    and xxh3 must match the last header; any failure raises a DecodeError
    subclass naming the version, and no bytes are returned. Each zstd stream
    segment of the chain is decompressed in a single call.

    ``max_state_bytes`` bounds what frames from an untrusted source may make
    this allocate: a chain with any version's state over it raises
    StateTooLargeError before anything is decompressed. (Frames are checked,
    not trusted, but a well-formed, checksummed frame may still declare a
    state of up to 4 GiB.) Peak memory is about two states plus one stream
    segment's output, which holds every version of that segment.
    """
    _check_chain_arg(frames)
    parsed = _parse_chain(frames)
    limit = _check_limit(max_state_bytes)
    if limit is not None:
        for header, _ in parsed:
            _check_state_size(header, limit)
    state = b""
    for segment in _segments(parsed):
        state = _decode_segment(segment, state)
    return state


def _parse_chain(frames: Iterable[FrameBytes]) -> list[tuple[FrameHeader, memoryview]]:
    """Parse and link-check a chain.

    This runs once per frame of every hydration, so the common case (a
    continuing frame) is checked inline, in one pass; anything unusual goes
    through parse() and _check_link(), which raise the precise error.
    """
    out: list[tuple[FrameHeader, memoryview]] = []
    prev: FrameHeader | None = None
    for frame in frames:
        view = as_bytes_view(frame)
        header: FrameHeader | None = None
        if prev is not None and len(view) >= HEADER_SIZE:
            f = HEAD.unpack_from(view)
            # f: magic, format, kind, flags, window_log, version, base_version,
            #    state_size, base_size, payload_size, prefix_size, state_xxh3, base_xxh3
            if (
                f[3] == FLAG_CONTINUES_STREAM
                and f[0] == MAGIC
                and f[1] == FORMAT_VERSION
                and len(view) == HEADER_SIZE + f[9]
                and f[4] == prev.window_log
                and f[6] == prev.version == f[5] - 1
                and f[8] == prev.state_size
                and f[12] == prev.state_xxh3
                and f[10] == 0
                and (
                    (f[2] == FrameKind.DELTA and f[7] <= MAX_EXPANSION * f[9])
                    or (f[2] == FrameKind.PATCH and f[8] <= f[7] <= MAX_EXPANSION * f[9] + f[8])
                )
                and frame_checksum(view) == CHECKSUM.unpack_from(view, HEAD.size)[0]
            ):
                header = FrameHeader(
                    kind=KINDS_BY_NUMBER[f[2]],
                    version=f[5],
                    base_version=f[6],
                    state_size=f[7],
                    base_size=f[8],
                    payload_size=f[9],
                    prefix_size=f[10],
                    state_xxh3=f[11],
                    base_xxh3=f[12],
                    window_log=f[4],
                    continues_stream=True,
                )
        if header is None:
            header, _ = parse(view)
            _check_link(prev, header)
        out.append((header, view[HEADER_SIZE:]))
        prev = header
    if not out:
        raise ValueError("decode needs at least one frame")
    return out


def iter_versions(frames: Iterable[FrameBytes], *, max_state_bytes: int | None = None) -> Iterator[DecodedVersion]:
    """Yield every version of a chain in order, each state verified against its header.

    ``max_state_bytes`` as for :func:`decode`, checked frame by frame: the
    versions before the first one over the limit are yielded, then
    StateTooLargeError is raised without decompressing that frame.
    """
    _check_chain_arg(frames)
    limit = _check_limit(max_state_bytes)
    prev: FrameHeader | None = None
    state = b""
    reader: _zstd.ZstdDecompressor | None = None
    for frame in frames:
        header, payload = parse(frame)
        _check_link(prev, header)
        if limit is not None:
            _check_state_size(header, limit)
        if not header.continues_stream:
            reader = _zstd.new_reader(window_log=header.window_log, prefix=_prefix_of(header, state))
        assert reader is not None  # _check_link refuses a chain starting with a continuation
        content = _decompress(reader, payload, header.content_size, header)
        state = state + content if header.kind is FrameKind.PATCH else content
        _verify_state(header, state)
        yield DecodedVersion(header, state)
        prev = header


def _check_chain_arg(frames: object) -> None:
    # One frame's bytes are iterable too (as ints): say what to pass instead.
    if isinstance(frames, (bytes, bytearray, memoryview)):
        raise TypeError(
            f"frames must be an iterable of frames (a chain, FULL frame first), not one"
            f" {type(frames).__name__} object; pass [frame] to decode a single FULL frame"
        )


def _check_limit(max_state_bytes: object) -> int | None:
    if max_state_bytes is None:
        return None
    if isinstance(max_state_bytes, bool) or not isinstance(max_state_bytes, int):
        raise TypeError(f"max_state_bytes must be an int or None, not {type(max_state_bytes).__name__}")
    if max_state_bytes < 0:
        raise ValueError(f"max_state_bytes must be >= 0, got {max_state_bytes}")
    return max_state_bytes


def _check_state_size(header: FrameHeader, limit: int) -> None:
    if header.state_size > limit:
        raise StateTooLargeError(
            f"frame of version {header.version} declares a {header.state_size}-byte state; max_state_bytes is {limit}",
            version=header.version,
            state_size=header.state_size,
            limit=limit,
        )


def _check_link(prev: FrameHeader | None, h: FrameHeader) -> None:
    if prev is None:
        if h.kind is not FrameKind.FULL:
            raise ChainLinkError(f"chain starts at version {h.version} with a {h.kind.name} frame; a chain starts FULL")
        return
    if h.kind is FrameKind.FULL:
        raise ChainLinkError(f"FULL frame of version {h.version} inside a chain (after version {prev.version})")
    if h.base_version != prev.version:
        raise ChainLinkError(
            f"frame of version {h.version} is a delta against version {h.base_version},"
            f" but follows version {prev.version}"
        )
    if h.base_size != prev.state_size or h.base_xxh3 != prev.state_xxh3:
        raise ChainLinkError(
            f"frame of version {h.version} expects a base of {h.base_size} bytes with xxh3 {h.base_xxh3:#018x};"
            f" version {prev.version} is {prev.state_size} bytes with xxh3 {prev.state_xxh3:#018x}"
        )
    if h.continues_stream and h.window_log != prev.window_log:
        raise ChainLinkError(
            f"frame of version {h.version} continues a stream with window_log {h.window_log},"
            f" but version {prev.version}'s stream has window_log {prev.window_log}"
        )


def _segments(parsed: list[tuple[FrameHeader, memoryview]]) -> Iterator[list[tuple[FrameHeader, memoryview]]]:
    segment: list[tuple[FrameHeader, memoryview]] = []
    for item in parsed:
        if segment and not item[0].continues_stream:
            yield segment
            segment = []
        segment.append(item)
    yield segment


def _decode_segment(segment: list[tuple[FrameHeader, memoryview]], base: bytes) -> bytes:
    first, last = segment[0][0], segment[-1][0]
    reader = _zstd.new_reader(window_log=first.window_log, prefix=_prefix_of(first, base))
    expected = sum(h.content_size for h, _ in segment)
    out = _decompress(reader, b"".join(p for _, p in segment), expected, last)
    # The head is the content of the segment's last whole-state frame (FULL or
    # DELTA) followed by every patch after it, which is exactly the tail of the
    # output from that frame on; with no whole-state frame it is base + output.
    offset, whole = 0, None
    for header, _ in segment:
        if header.kind is not FrameKind.PATCH:
            whole = offset
        offset += header.content_size
    state = base + out if whole is None else out[whole:]
    _verify_state(last, state)
    return state


def _prefix_of(header: FrameHeader, base: bytes) -> bytes | None:
    if header.continues_stream or not header.prefix_size:
        return None
    if header.prefix_size > len(base):
        raise ChainLinkError(
            f"frame of version {header.version} references a {header.prefix_size}-byte prefix"
            f" of a {len(base)}-byte base state"
        )
    return base[len(base) - header.prefix_size :]


def _decompress(reader: _zstd.ZstdDecompressor, data: FrameBytes, expected: int, header: FrameHeader) -> bytes:
    try:
        # max_length bounds the output: a corrupt or hostile payload cannot
        # make us allocate more than its headers promise (one byte over tells
        # "too long" apart from "exactly right").
        out = reader.decompress(data, max_length=expected + 1)
    except _zstd.ZstdError as exc:
        raise DecodeError(f"zstd payload of version {header.version} is corrupt: {exc}") from None
    except EOFError:
        # An earlier payload ended the zstd frame (or was a skippable frame):
        # the writer never ends a stream, so nothing can continue it.
        raise DecodeError(
            f"frame of version {header.version} continues a zstd stream that an earlier frame ended"
            f" ({len(data)}-byte payload)"
        ) from None
    if len(out) != expected:
        more = "more than " if len(out) > expected else ""
        raise ChecksumError(
            f"payload of version {header.version} decompressed to {more}{min(len(out), expected)} bytes;"
            f" its headers say {expected}"
        )
    return out


def _verify_state(header: FrameHeader, state: bytes) -> None:
    if len(state) != header.state_size:
        raise ChecksumError(
            f"state of version {header.version} is {len(state)} bytes; its header says {header.state_size}"
        )
    if state_checksum(state) != header.state_xxh3:
        raise ChecksumError(
            f"state of version {header.version} ({len(state)} bytes) fails its xxh3 check:"
            f" computed {state_checksum(state):#018x}, stored {header.state_xxh3:#018x}"
        )
