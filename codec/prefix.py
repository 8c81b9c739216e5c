"""PREFIX frames: a version whose state is the first bytes of a newer version's state (FORMAT.md §12).

A run of versions that only appended to a state (a FULL or DELTA frame, then
PATCH frames) can be stored as its last version's FULL frame and, for each
earlier version, a header-only PREFIX frame naming that last version (its
source) and how many bytes of the source's state are its own. A PREFIX frame
is no part of a chain: decode() and iter_versions() refuse one
(PrefixFrameError); a reader decodes the source's state and takes the prefix
with :func:`prefix_state`. From a source stored as one sealed FULL frame,
:func:`sealed_prefix` decodes only the bytes the PREFIX frame takes.
"""

from __future__ import annotations

from . import _zstd
from .chainchecks import check_limit
from .decoder import DecodedVersion, decode_latest
from .encoded import EncodedFrame
from .encoder import _MAX_VERSION
from .errors import ChainLinkError, ChecksumError, DecodeError
from .frame import FrameHeader, FrameKind, as_bytes_view, parse, state_checksum, write
from .sealed import FrameBytes, check_sealed_payload

#: The window_log a PREFIX frame's header carries: it has no stream, so the smallest a header may hold.
PREFIX_WINDOW_LOG = 10


def prefix_frame(
    source_state: bytes | bytearray | memoryview, *, version: int, source_version: int, state_size: int
) -> EncodedFrame:
    """A PREFIX frame (format 2) saying version ``version``'s state is the first ``state_size`` bytes of
    version ``source_version``'s state, ``source_state``.

    Its ``state_xxh3`` is the xxh3 of ``source_state[:state_size]``: compare it with the frame it replaces
    before storing it, which proves that version's state is that prefix. ValueError naming the argument
    unless 1 <= version < source_version <= 2**64 - 1 and 0 <= state_size <= len(source_state); TypeError
    for an argument of the wrong type.
    """
    view = _source_view(source_state)
    for name, value in (("version", version), ("source_version", source_version), ("state_size", state_size)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not 1 <= version <= _MAX_VERSION:
        raise ValueError(f"version must be in 1..{_MAX_VERSION}, got {version}")
    if not version < source_version <= _MAX_VERSION:
        raise ValueError(
            f"source_version must be newer than version {version} (and <= {_MAX_VERSION}), got {source_version}"
        )
    if not 0 <= state_size <= len(view):
        raise ValueError(f"state_size must be in 0..{len(view)} (the source state's size), got {state_size}")
    header = FrameHeader(
        kind=FrameKind.PREFIX,
        version=version,
        base_version=source_version,
        state_size=state_size,
        base_size=len(view),
        payload_size=0,
        prefix_size=0,
        state_xxh3=state_checksum(view[:state_size]),
        base_xxh3=0,
        window_log=PREFIX_WINDOW_LOG,
        continues_stream=False,
        format=2,
    )
    return EncodedFrame(header, write(header, b""))


def prefix_state(
    frame: FrameBytes,
    source_state: bytes | bytearray | memoryview,
    *,
    source_version: int,
    source_size: int | None = None,
) -> DecodedVersion:
    """The version a PREFIX frame stores, from its source's state ``source_state`` (version
    ``source_version``), or from its first bytes (:func:`sealed_prefix`) if ``source_size`` gives the size
    of the whole state.

    The frame is checked whole (frame_check and field rules: parse()); then it must be a PREFIX frame
    (else DecodeError naming its kind), name ``source_version`` as its source and ``source_state``'s size
    as its base_size (else ChainLinkError naming both values), and the prefix must match its state_xxh3
    (else ChecksumError naming the version). No bytes are returned unless every check passes. ValueError if
    ``source_size`` is given and ``source_state`` holds fewer bytes than the frame's state.
    """
    view = _source_view(source_state)
    if not isinstance(source_version, int) or isinstance(source_version, bool):
        raise TypeError(f"source_version must be an int, not {type(source_version).__name__}")
    if source_size is not None and (not isinstance(source_size, int) or isinstance(source_size, bool)):
        raise TypeError(f"source_size must be an int or None, not {type(source_size).__name__}")
    whole = len(view) if source_size is None else source_size
    header, _ = parse(frame)
    if header.kind is not FrameKind.PREFIX:
        raise DecodeError(
            f"version {header.version} is a {header.kind.name} frame, not a PREFIX frame: decode its chain"
        )
    if header.base_version != source_version:
        raise ChainLinkError(
            f"PREFIX frame of version {header.version} takes its state from version {header.base_version},"
            f" not from version {source_version}"
        )
    if header.base_size != whole:
        raise ChainLinkError(
            f"PREFIX frame of version {header.version} expects version {source_version}'s state to be"
            f" {header.base_size} bytes; the state given is {whole} bytes"
        )
    if header.state_size > len(view):
        raise ValueError(
            f"source_state holds {len(view)} bytes of version {source_version}'s state; version"
            f" {header.version}'s state is its first {header.state_size}"
        )
    state = bytes(view[: header.state_size])
    computed = state_checksum(state)
    if computed != header.state_xxh3:
        raise ChecksumError(
            f"state of version {header.version} (the first {header.state_size} bytes of version"
            f" {source_version}'s state) fails its xxh3 check: computed {computed:#018x},"
            f" stored {header.state_xxh3:#018x}"
        )
    return DecodedVersion(header, state)


def sealed_prefix(frame: FrameBytes, size: int, *, max_state_bytes: int | None = None) -> tuple[FrameHeader, bytes]:
    """The header of the version ``frame`` stores, a chain of one FULL frame, and the first ``size`` bytes
    of its state (the whole state if it is no larger): what a PREFIX frame of a ``size``-byte state whose
    source is that version takes (pass the header's state_size as prefix_state's ``source_size``).

    A sealed frame (FORMAT.md §13) is checked whole (frame_check and field rules: parse(); its payload as a
    decode checks it), then only the zstd blocks holding those bytes are decoded: they are not checked by
    the frame's state_xxh3, the whole state's, so check them with the PREFIX frame's (prefix_state). Any
    other frame, or any doubt (damage, a state over ``max_state_bytes``), is decoded whole by
    :func:`decode_latest`, with its errors. ValueError unless ``size`` >= 0; TypeError if not an int.
    """
    if not isinstance(size, int) or isinstance(size, bool):
        raise TypeError(f"size must be an int, not {type(size).__name__}")
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    limit = check_limit(max_state_bytes)
    try:
        header, payload = parse(frame)
        if header.sealed and size < header.state_size and (limit is None or header.state_size <= limit):
            window = check_sealed_payload(
                payload, version=header.version, size=header.state_size, window_log=header.window_log
            )
            out = _zstd.decompress_sealed_prefix(payload, size, window=window)
            if out is not None:
                return header, out
    except DecodeError:  # the whole decode below raises what a read of the version raises
        pass
    latest = decode_latest([frame], max_state_bytes=max_state_bytes)
    return latest.header, latest.state[:size]


def _source_view(source_state: object) -> memoryview:
    if not isinstance(source_state, (bytes, bytearray, memoryview)):
        raise TypeError(f"source_state must be bytes, bytearray or memoryview, not {type(source_state).__name__}")
    return as_bytes_view(source_state)
