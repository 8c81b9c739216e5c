"""A chain's checks that raise: the arguments a reader takes, the bounds on what it may allocate, and the
links between consecutive frames' headers (FORMAT.md §5), each error naming the version it is about."""

from __future__ import annotations

from collections.abc import Sequence

from .chainstats import segment_link_base
from .errors import ChainLinkError, OutputTooLargeError, PrefixFrameError, StateTooLargeError
from .header import FrameHeader, FrameKind


def check_chain_arg(frames: object) -> None:
    # One frame's bytes are iterable too (as ints): say what to pass instead.
    if isinstance(frames, (bytes, bytearray, memoryview)):
        raise TypeError(
            f"frames must be an iterable of frames (a chain, FULL frame first), not one"
            f" {type(frames).__name__} object; pass [frame] to decode a single FULL frame"
        )


def check_limit(max_state_bytes: object, name: str = "max_state_bytes") -> int | None:
    if max_state_bytes is None:
        return None
    if isinstance(max_state_bytes, bool) or not isinstance(max_state_bytes, int):
        raise TypeError(f"{name} must be an int or None, not {type(max_state_bytes).__name__}")
    if max_state_bytes < 0:
        raise ValueError(f"{name} must be >= 0, got {max_state_bytes}")
    return max_state_bytes


def check_state_size(header: FrameHeader, limit: int) -> None:
    if header.state_size > limit:
        raise StateTooLargeError(
            f"frame of version {header.version} declares a {header.state_size}-byte state; max_state_bytes is {limit}",
            version=header.version,
            state_size=header.state_size,
            limit=limit,
        )


def check_output(output_bytes: int, limit: int, version: int) -> None:
    if output_bytes > limit:
        raise OutputTooLargeError(
            f"decoding version {version} would output {output_bytes} bytes (its chain's states and patches);"
            f" max_output_bytes is {limit}",
            version=version,
            output_bytes=output_bytes,
            limit=limit,
        )


def check_link(prev: FrameHeader | None, h: FrameHeader, run: Sequence[FrameHeader] = ()) -> None:
    if h.kind is FrameKind.PREFIX:
        raise prefix_frame_error(h)
    if prev is None:
        if h.kind is not FrameKind.FULL:
            raise ChainLinkError(f"chain starts at version {h.version} with a {h.kind.name} frame; a chain starts FULL")
        return
    if h.kind is FrameKind.FULL:
        raise ChainLinkError(f"FULL frame of version {h.version} inside a chain (after version {prev.version})")
    base = prev
    if h.base_version != prev.version:
        base = segment_link_base(prev, h, run)
    # Only format 1 records its base's xxh3; format 2 leaves a wrong base to
    # the produced state's xxh3.
    if h.base_size != base.state_size or (h.format == 1 and h.base_xxh3 != base.state_xxh3):
        with_xxh3 = f" with xxh3 {h.base_xxh3:#018x}" if h.format == 1 else ""
        raise ChainLinkError(
            f"frame of version {h.version} expects a base of {h.base_size} bytes{with_xxh3};"
            f" version {base.version} is {base.state_size} bytes with xxh3 {base.state_xxh3:#018x}"
        )
    if h.continues_stream and prev.sealed:
        raise ChainLinkError(
            f"frame of version {h.version} continues a stream, but version {prev.version} is a sealed FULL"
            f" frame, whose zstd frame ended its stream"
        )
    if h.continues_stream and h.window_log != prev.window_log:
        raise ChainLinkError(
            f"frame of version {h.version} continues a stream with window_log {h.window_log},"
            f" but version {prev.version}'s stream has window_log {prev.window_log}"
        )


def prefix_frame_error(h: FrameHeader) -> PrefixFrameError:
    """The error of a chain's reader given the PREFIX frame ``h`` (FORMAT.md §12)."""
    return PrefixFrameError(
        f"version {h.version} is a PREFIX frame: its state is the first {h.state_size} bytes of version"
        f" {h.base_version}'s state (read it with prefix_state from that state, not as part of a chain)",
        version=h.version,
        source_version=h.base_version,
        state_size=h.state_size,
    )
