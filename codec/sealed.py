"""Sealed FULL frames (FORMAT.md §13): a payload that is one whole zstd frame declaring its content size.

A folded head and a quiet keyframe are stored this way, so the cold read of a quiet session is one of
these: checked (:func:`check_sealed_payload`) and decoded in one shot (:func:`decompress_sealed`).
"""

from __future__ import annotations

from . import _zstd
from .errors import ChecksumError, DecodeError

FrameBytes = bytes | bytearray | memoryview


def decompress_sealed(data: FrameBytes, *, version: int, size: int, window_log: int) -> bytes:
    """The state of sealed FULL frame ``version``: its payload is one zstd frame declaring a content size
    of ``size`` (state_size), checked before anything is allocated, that ends exactly at the payload's end
    (FORMAT.md §13). Decoded in one shot through the thread's reused context, which allocates no window;
    if that fails, a stdlib decompressor reads it again and names the error."""
    check_sealed_payload(data, version=version, size=size, window_log=window_log)
    v = version
    out = _zstd.decompress_sealed(data)
    if out is not None and len(out) == size:
        return out
    reader = _zstd.new_reader(window_log=window_log, prefix=None)
    try:
        out = reader.decompress(data, max_length=size + 1)
    except _zstd.ZstdError as exc:
        raise DecodeError(f"zstd payload of sealed version {v} is corrupt: {exc}") from None
    if not reader.eof or reader.unused_data or len(out) != size:
        raise ChecksumError(f"payload of sealed version {v} decompressed to {len(out)} bytes; its header says {size}")
    return out


def check_sealed_payload(data: FrameBytes, *, version: int, size: int, window_log: int) -> int:
    """The window a sealed FULL frame's payload asks for, if it is one zstd frame declaring a content size
    of ``size`` (state_size), asking for a window within 2**window_log and ending exactly at the payload's
    end (FORMAT.md §13); else DecodeError naming sealed version ``version``."""
    v = version
    if data[:4] != _zstd.ZSTD_MAGIC:
        raise DecodeError(
            f"payload of sealed version {v} does not start a zstd frame: its first bytes are"
            f" {bytes(data[:4]).hex() or 'none'}, not 28b52ffd"
        )
    try:
        # The window is what a streaming decoder of the frame would hold (FORMAT.md §4).
        declared, window = _zstd.frame_header(data)
    except _zstd.ZstdError as exc:
        raise DecodeError(f"zstd payload of sealed version {v} is corrupt: {exc}") from None
    if declared != size:
        said = "no content size" if declared is None else f"a content size of {declared} bytes"
        raise DecodeError(f"the zstd frame of sealed version {v} declares {said}; its state_size is {size}")
    if window > 1 << window_log:
        raise DecodeError(
            f"zstd payload of sealed version {v} is corrupt: its zstd frame asks for a {window}-byte window,"
            f" over 2**{window_log} (window_log)"
        )
    try:
        end = _zstd.zstd.get_frame_size(data)
    except _zstd.ZstdError:
        end = -1
    if end != len(data):
        where = "does not end in" if end < 0 else f"ends {len(data) - end} bytes before the end of"
        raise DecodeError(
            f"the zstd frame of sealed version {v} {where} its {len(data)}-byte payload; a sealed frame's"
            f" payload is one zstd frame"
        )
    return window
