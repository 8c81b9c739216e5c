"""Turn a chain of frames back into states, verifying every link and checksum."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from . import _zstd
from .errors import ChainLinkError, ChecksumError, DecodeError
from .frame import FrameHeader, FrameKind, parse, state_checksum

FrameBytes = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class DecodedVersion:
    header: FrameHeader
    state: bytes

    @property
    def version(self) -> int:
        return self.header.version


def decode(frames: Iterable[FrameBytes]) -> bytes:
    """Return the state of the last frame of a chain (FULL frame first).

    Every frame's checksum and base link is verified, and the result's size
    and xxh3 must match the last header; any failure raises a DecodeError
    subclass naming the version, and no bytes are returned. Each zstd stream
    segment of the chain is decompressed in a single call.
    """
    parsed = [parse(f) for f in frames]
    _check_links([h for h, _ in parsed])
    state = b""
    for segment in _segments(parsed):
        state = _decode_segment(segment, state)
    return state


def iter_versions(frames: Iterable[FrameBytes]) -> Iterator[DecodedVersion]:
    """Yield every version of a chain in order, each state verified against its header."""
    prev: FrameHeader | None = None
    state = b""
    reader: _zstd.ZstdDecompressor | None = None
    for frame in frames:
        header, payload = parse(frame)
        _check_link(prev, header)
        if not header.continues_stream:
            reader = _zstd.new_reader(window_log=header.window_log, prefix=_prefix_of(header, state))
        assert reader is not None  # _check_link refuses a chain starting with a continuation
        content = _decompress(reader, payload, header.content_size, header)
        state = state + content if header.kind is FrameKind.PATCH else content
        _verify_state(header, state)
        yield DecodedVersion(header, state)
        prev = header


def _check_links(headers: Sequence[FrameHeader]) -> None:
    if not headers:
        raise ValueError("decode needs at least one frame")
    prev = None
    for header in headers:
        _check_link(prev, header)
        prev = header


def _check_link(prev: FrameHeader | None, h: FrameHeader) -> None:
    if prev is None:
        if h.kind is not FrameKind.FULL:
            raise ChainLinkError(f"chain starts at version {h.version} with a {h.kind.name} frame; a chain starts FULL")
        return
    if h.kind is FrameKind.FULL:
        raise ChainLinkError(f"FULL frame of version {h.version} inside a chain (after version {prev.version})")
    if h.base_version != prev.version:
        raise ChainLinkError(
            f"frame of version {h.version} is a delta against version {h.base_version}, but follows version {prev.version}"
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
