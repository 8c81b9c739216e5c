"""Keyframes: a FULL frame of a stored version's state, for a store rewriting its head (FORMAT.md §13)."""

from __future__ import annotations

import xxhash

from .encoded import EncodedFrame
from .encoder import _MAX_VERSION, Buffer, ChainEncoder, _as_bytes, _check_size
from .frame import FORMAT_VERSION
from .policy import DEFAULT_POLICY, ChainPolicy


def keyframe(
    state: Buffer, *, version: int, policy: ChainPolicy = DEFAULT_POLICY, format_version: int = FORMAT_VERSION
) -> EncodedFrame:
    """A FULL frame of ``state`` as version ``version``.

    For a store that replaces a stored DELTA/PATCH head with a frame of the
    same state that decodes alone (its chain then starts there). Frames
    stored after it must start a new chain stream: resume an encoder from
    the new frame rather than keep one that encoded the old head.

    In format 2 the frame is sealed (FORMAT.md §13): its payload is one whole
    zstd frame that declares the state's size, which a reader decodes in one
    shot (a 23 MB state: about half the time of a stream's decode); no frame
    continues its stream. Format 1 has no such frame: an unsealed FULL frame.
    """
    state = _as_bytes(state, "state")
    if not isinstance(version, int) or isinstance(version, bool):
        raise TypeError(f"version must be an int, not {type(version).__name__}")
    if version < 1:
        raise ValueError(f"version must be >= 1, got {version}")
    if version > _MAX_VERSION:
        raise ValueError(f"version must be <= {_MAX_VERSION} (2**64 - 1, the largest a frame holds), got {version}")
    _check_size(len(state), version)
    encoder = ChainEncoder(policy=policy, format_version=format_version)
    encoder._version = version - 1
    return encoder._full(state, xxhash.xxh3_64(state), sealed=format_version == 2)
