"""Turn a chain of frames back into states, verifying every state returned.

decode() (the latest state, what every cold read needs) runs a cheap first
pass and verifies only what it returns; iter_versions() (what ``ckpt verify``
runs) verifies every frame and every version.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from . import _zstd, frame_v1, frame_v2
from .chainchecks import check_chain_arg, check_limit, check_link, check_output, check_state_size
from .errors import (
    ChainLinkError,
    ChecksumError,
    DecodeError,
)
from .frame import (
    KINDS_BY_NUMBER,
    MAX_EXPANSION,
    MIN_PREFIX_SIZE,
    FrameHeader,
    FrameKind,
    parse,
    parse_named,
    state_checksum,
)
from .pieces import StatePieces
from .sealed import FrameBytes, decompress_sealed

_Scan = Callable[[FrameBytes], tuple[int, int, int, int, int, int, int, int, int, int, int]]
# By byte 2 of a frame: the format byte of format 2, the "P" of format 1's b"CKPF".
_SCANNERS: dict[int, _Scan] = {2: frame_v2.scan, frame_v1.MAGIC[2]: frame_v1.scan}
# kind_flags as format 2 packs them (frame_v1.scan packs format 1's the same way).
_FULL, _DELTA, _PATCH = FrameKind.FULL.value, FrameKind.DELTA.value, FrameKind.PATCH.value
_DELTA_CONTINUING = _DELTA | frame_v2.FLAG_CONTINUES_STREAM
_PATCH_CONTINUING = _PATCH | frame_v2.FLAG_CONTINUES_STREAM
_FULL_SEALED = _FULL | frame_v2.FLAG_SEALED
_NO_LIMIT = 1 << 64
_U64 = frame_v2.U64


def scanned_state_xxh3(frame: FrameBytes) -> int | None:
    """The state's XXH3-64 a frame's header records, read by the first pass's scan without checking the
    frame (its checksum covers the whole frame); None if the header does not scan."""
    try:
        scan = _SCANNERS[frame[2]]
        return int(_U64.unpack_from(frame, scan(frame)[8])[0])
    except (KeyError, ValueError, IndexError, struct.error):
        return None


def scanned_frame_header(frame: FrameBytes) -> FrameHeader:
    """A frame's header as the first pass's scan reads it, without checking the frame (its checksum covers
    the whole frame: ~0.1 s for a 75 MB one), for what only decides by it (a chain's stats); ValueError if
    the header does not scan."""
    try:
        kf, wl, version, distance, state_size, base_size, prefix, payload_size, at, _, base_xxh3 = _SCANNERS[frame[2]](
            frame
        )
        xxh3 = int(_U64.unpack_from(frame, at)[0])
        return scanned_header(
            kf, wl, version, distance, state_size, base_size, prefix, payload_size, xxh3, base_xxh3, frame
        )
    except (KeyError, IndexError, struct.error) as exc:
        raise ValueError(f"the frame's header does not scan ({exc!r})") from None


class DecodedVersion(NamedTuple):
    """A version's frame header and state (a NamedTuple, as FrameHeader: cheaper to build per version)."""

    header: FrameHeader
    state: bytes

    @property
    def version(self) -> int:
        return self.header.version


def decode(frames: Iterable[FrameBytes], *, max_state_bytes: int | None = None) -> bytes:
    """Return the state of the last frame of a chain (FULL frame first).

    The result's size and xxh3 must match the last frame's header, and every
    header must be well-formed and link to the frame before it; any failure
    raises a DecodeError subclass naming the version, and no bytes are
    returned. Each zstd stream of the chain is decompressed in a single call.

    Per frame, only the header's structure and links are checked: one xxh3
    pass over the result stands for the per-frame checksums (a damaged frame
    that still yields the right state is not an error here; iter_versions
    finds it). When anything fails, the chain is read again frame by frame
    as iter_versions reads it, checksums and every version's state included,
    and raises the error iter_versions raises (naming the same version). A
    payload that ends its stream's zstd frame, or a zstd frame header asking
    for a window over the header's window_log, is a DecodeError (FORMAT.md §4).
    No frames at all is a ValueError: a chain starts with its FULL frame.

    ``max_state_bytes`` bounds what frames from an untrusted source may make
    this allocate: a chain with any version's state over it raises
    StateTooLargeError before anything is decompressed, naming the first
    such version, unless a frame before it is damaged (the first failure in
    chain order is the error, as in iter_versions). (A well-formed frame
    may declare a state of up to 4 GiB and more.) Peak memory is about two
    states plus one stream's output, which holds every version of that stream.
    """
    return decode_latest(frames, max_state_bytes=max_state_bytes).state


def decode_latest(frames: Iterable[FrameBytes], *, max_state_bytes: int | None = None) -> DecodedVersion:
    """:func:`decode`, with the last frame's header: what a reader reports of the version it read,
    without parsing that frame a second time."""
    check_chain_arg(frames)
    limit = check_limit(max_state_bytes)
    chain = list(frames)
    if not chain:
        raise ValueError("decode needs at least one frame")
    try:
        # A quiet session's head (folded, or a quiet keyframe) is one sealed FULL frame: most cold reads.
        found = _sealed_alone(chain[0], limit) if len(chain) == 1 else None
        if found is None:
            found = _latest(chain, limit)
    except Exception:  # whatever the first pass tripped on, the checked pass below names it
        found = None
    if found is None:
        state = _latest_checked(chain, limit)
        return DecodedVersion(parse(chain[-1])[0], state)
    return found


def decode_sealed(frame: FrameBytes, *, max_state_bytes: int | None = None) -> DecodedVersion | None:
    """:func:`decode_latest` of the chain of one ``frame``, if it is a sealed format 2 FULL frame (a quiet
    session's folded head), without a chain to gather; None for any other frame, or on any doubt (a state
    over ``max_state_bytes`` too): the chain's decode then decides, and names the error."""
    return _sealed_alone(frame, check_limit(max_state_bytes))


def _sealed_alone(f: FrameBytes, limit: int | None) -> DecodedVersion | None:
    """The state of ``f`` if it is a sealed format 2 FULL frame (a chain of one), checked as the first pass
    checks it, without the first pass's bookkeeping of streams (a few us of a ~30 us cold read); None if
    it is another frame, or on any doubt: the first pass, then the checked one, decide and name the error."""
    if len(f) < 4 or f[2] != 2 or f[3] != _FULL_SEALED:
        return None
    try:
        _, wl, version, distance, state_size, base_size, prefix, payload_size, xxh3_at, start, _ = frame_v2.scan(f)
        xxh3 = _U64.unpack_from(f, xxh3_at)[0]
    except (ValueError, IndexError, struct.error):  # a header cut short or malformed
        return None
    limit = _NO_LIMIT if limit is None else limit
    if not _starts_chain(wl, version, distance, state_size, base_size, prefix, payload_size, len(f) - start, limit):
        return None
    payload = f[start:]
    # The checks sealed.decompress_sealed makes, as two of zstd's own calls (a doubt: the checked pass names it).
    if not _zstd.sealed_payload_fits(payload, state_size, 1 << wl):
        return None
    state = _zstd.decompress_sealed(payload)
    if state is None or len(state) != state_size or state_checksum(state) != xxh3:
        return None
    header = FrameHeader(FrameKind.FULL, version, 0, state_size, 0, payload_size, 0, xxh3, 0, wl, False, 2, True)
    return DecodedVersion(header, state)


def _starts_chain(
    wl: int, version: int, distance: int, state_size: int, base_size: int, prefix: int, payload_size: int,
    stored_payload: int, limit: int,
) -> bool:  # fmt: skip
    """Whether a FULL frame's scanned header is one the one-pass decode starts a chain with: no base, a
    version, exactly its payload stored, a window log zstd takes, a state within ``limit`` and zstd's
    expansion of its payload."""
    return not (
        distance
        or base_size
        or prefix
        or version < 1
        or stored_payload != payload_size
        or not 10 <= wl <= 31
        or state_size > MAX_EXPANSION * payload_size
        or state_size > limit
    )


def _latest(chain: list[FrameBytes], limit: int | None) -> DecodedVersion | None:
    """The latest version if every header is well-formed and linked and the result checks out, else None
    (see :func:`latest_with_reader`)."""
    found = _first_pass(chain, limit, None, keep_reader=False)
    return None if found is None else found[0]


def linked_content(
    kf: int, wl: int, version: int, distance: int, state_size: int, base_size: int, prefix: int,
    stored_payload: int, payload_size: int, prev_version: int, prev_size: int, prev_wl: int, limit: int,
) -> int:  # fmt: skip
    """What a frame after the first adds to its stream's output, if its scanned header is linked to the
    previous frame's (``prev_*``) and is one the one-pass decode takes (a PATCH or DELTA, continuing the
    stream or starting one, within ``limit`` and zstd's expansion); -1 otherwise. ``prev_wl`` is -1 after
    a sealed FULL frame, whose stream no frame continues (FORMAT.md §13). The one place both the one-pass
    decode and ChainReader.advance judge a frame by."""
    if distance == 1:
        if version != prev_version + 1 or base_size != prev_size:
            return -1
    elif kf != _PATCH or distance < 1 or version != prev_version + distance or base_size != prev_size:
        return -1
    if stored_payload != payload_size or state_size > limit:
        return -1
    if kf == _PATCH_CONTINUING:
        content = state_size - base_size
        if content < 0 or prefix or wl != prev_wl:
            return -1
    elif kf == _DELTA_CONTINUING:
        content = state_size
        if prefix or wl != prev_wl:
            return -1
    elif kf in (_PATCH, _DELTA):  # starts a stream
        if kf == _PATCH:
            content = state_size - base_size
            if content < 0 or prefix > base_size:
                return -1
        else:
            content = state_size
            if prefix and prefix != base_size:
                return -1
        if not 10 <= wl <= 31 or 0 < prefix < MIN_PREFIX_SIZE:
            return -1
    else:  # FULL inside a chain, or a kind or flag this codec does not know
        return -1
    return -1 if content > MAX_EXPANSION * payload_size else content


def latest_with_reader(
    chain: list[FrameBytes], limit: int | None, max_output: int | None = None
) -> tuple[DecodedVersion, _zstd.ZstdDecompressor | None] | None:
    """The latest version if every header is well-formed and linked and the result checks out, else None;
    with the decompressor of the chain's last stream, positioned at its end (chainreader.py continues it),
    or None if that stream is a sealed FULL frame's, which has ended (FORMAT.md §13). OutputTooLargeError,
    before anything is decompressed, if the well-formed chain's streams would output more than
    ``max_output`` bytes.
    """
    return _first_pass(chain, limit, max_output, keep_reader=True)


def _first_pass(
    chain: list[FrameBytes], limit: int | None, max_output: int | None, *, keep_reader: bool
) -> tuple[DecodedVersion, _zstd.ZstdDecompressor | None] | None:
    """The first pass of decode(): per frame a header scan (frame_v1/v2.scan)
    and the checks of frame.parse and check_link but the frame checksum, as
    integer comparisons on locals. This loop is most of a cold read's Python,
    so a continuing PATCH frame (the common case) takes the shortest path.

    A stream without a prefix is read through the thread's reused zstd
    context (_zstd.decompress_once), unless it is the last one and
    ``keep_reader`` asks for its live decompressor; a stream that refuses,
    or has a prefix, is read by a new stdlib decompressor, which decides. A
    sealed FULL frame's stream is one zstd frame, checked and decoded in one
    shot (sealed.decompress_sealed); its DecodeError leaves the chain to the
    checked pass, which raises it again.
    """
    scanners = _SCANNERS
    limit = _NO_LIMIT if limit is None else limit
    f = chain[0]
    kf, wl, version, distance, state_size, base_size, prefix, payload_size, xxh3_at, start, base_xxh3 = scanners[f[2]](
        f
    )
    sealed = kf == _FULL_SEALED
    if (kf != _FULL and not sealed) or not _starts_chain(
        wl, version, distance, state_size, base_size, prefix, payload_size, len(f) - start, limit
    ):
        return None
    first_version = version
    # Streams so far: (window_log, prefix_size, payloads, output size, offset
    # of the last whole state in the output or -1 if only patches, bytes of
    # the state before it that a stream of patches extends: its base's size).
    streams: list[tuple[int, int, list[FrameBytes], int, int, int]] = []
    stream_wl, stream_prefix, parts, total, whole, keep = wl, 0, [f[start:]], state_size, 0, 0
    # No frame continues a sealed frame's stream: no window_log (a byte) is -1.
    prev_version, prev_size, prev_wl, prev_xxh3_at, prev = version, state_size, -1 if sealed else wl, xxh3_at, f
    # State sizes by version from the first frame on while the frames are consecutive versions, and the
    # version the run of PATCH frames starts at: a segment read after the version before it names its base.
    sizes = [state_size]
    run_start = version
    for f in chain[1:]:
        scan = scanners[f[2]]
        kf, wl, version, distance, state_size, base_size, prefix, payload_size, xxh3_at, start, base_xxh3 = scan(f)
        if distance > 1 and version == prev_version + 1:
            base = version - distance
            if (
                kf != _PATCH
                or len(sizes) != version - first_version
                or base < run_start
                or sizes[base - first_version] != base_size
            ):
                return None
            prev_version, prev_size = base, base_size
        sizes.append(state_size)
        content = linked_content(
            kf, wl, version, distance, state_size, base_size, prefix, len(f) - start, payload_size,
            prev_version, prev_size, prev_wl, limit,
        )  # fmt: skip
        if content < 0:
            return None
        if kf == _PATCH_CONTINUING:
            parts.append(f[start:])
        elif kf == _DELTA_CONTINUING:
            whole = total
            parts.append(f[start:])
            run_start = version
        else:  # a PATCH or DELTA starts a stream
            streams.append((stream_wl, stream_prefix, parts, total, whole, keep))
            stream_wl, stream_prefix, parts, total = wl, prefix, [f[start:]], 0
            whole, keep = -1 if kf == _PATCH else 0, base_size
            if kf != _PATCH:
                run_start = version
        if base_xxh3 >= 0 and base_xxh3 != _U64.unpack_from(prev, prev_xxh3_at)[0]:
            return None  # a format 1 frame's link to its base's xxh3
        total += content
        prev_version, prev_size, prev_wl, prev_xxh3_at, prev = version, state_size, wl, xxh3_at, f
    streams.append((stream_wl, stream_prefix, parts, total, whole, keep))
    if max_output is not None:
        check_output(sum(stream[3] for stream in streams), max_output, version)
    pieces = StatePieces()
    reader = None
    kept = streams[-1] if keep_reader else None
    for stream in streams:
        wl, prefix_size, payloads, size, whole, keep = stream
        if keep > pieces.size or prefix_size > keep:
            return None
        data = payloads[0] if len(payloads) == 1 else b"".join(payloads)
        if sealed and stream is streams[0]:  # one payload, one whole zstd frame: no live stream to keep
            pieces.replace(decompress_sealed(data, version=first_version, size=size, window_log=wl))
            continue
        # A segment read after the version before it extends the first bytes of that state, its base's.
        pieces.cut(keep)
        out = None if prefix_size or stream is kept else _zstd.decompress_once(data, window_log=wl, size=size)
        if out is None:
            reader = _zstd.new_reader(window_log=wl, prefix=pieces.tail(prefix_size) if prefix_size else None)
            out = reader.decompress(data, max_length=size + 1)
            # A stream's zstd frame never ends (nor leaves input undecoded): FORMAT.md §4.
            if len(out) != size or reader.eof or not reader.needs_input:
                return None
        # From the stream's last whole-state frame (FULL or DELTA) on, the
        # output is that state and every patch after it; a stream of patches
        # only extends the state before it.
        if whole >= 0:
            pieces.replace(out[whole:])
        else:
            pieces.add(out)
    state = pieces.join()
    xxh3 = _U64.unpack_from(prev, prev_xxh3_at)[0]
    if len(state) != prev_size or state_checksum(state) != xxh3:
        return None
    header = scanned_header(
        kf, wl, version, distance, state_size, base_size, prefix, payload_size, xxh3, base_xxh3, prev
    )
    return DecodedVersion(header, state), reader


def scanned_header(
    kf: int,
    wl: int,
    version: int,
    distance: int,
    state_size: int,
    base_size: int,
    prefix: int,
    payload_size: int,
    xxh3: int,
    base_xxh3: int,
    frame: FrameBytes,
) -> FrameHeader:
    """The FrameHeader of a frame a first pass scanned (and whose chain's state checked out)."""
    kind = KINDS_BY_NUMBER[kf & 3]
    return FrameHeader(
        kind=kind,
        version=version,
        base_version=version + distance if kind is FrameKind.PREFIX else version - distance if distance else 0,
        state_size=state_size,
        base_size=base_size,
        payload_size=payload_size,
        prefix_size=prefix,
        state_xxh3=xxh3,
        base_xxh3=max(base_xxh3, 0),
        window_log=wl,
        continues_stream=bool(kf & frame_v2.FLAG_CONTINUES_STREAM),
        format=2 if frame[2] == 2 else 1,
        sealed=bool(kf & frame_v2.FLAG_SEALED),
    )


def _latest_checked(chain: list[FrameBytes], limit: int | None, max_output: int | None = None) -> bytes:
    """decode() frame by frame, raising the error iter_versions raises for the chain: every header and link
    is checked, and the bounds (StateTooLargeError past ``limit``, OutputTooLargeError past ``max_output``),
    before anything is decompressed; then the frames are read in order as iter_versions reads them."""
    parsed: list[tuple[FrameHeader, memoryview]] = []
    failure: DecodeError | None = None
    try:
        for item in _linked(chain, None):
            parsed.append(item)
    except DecodeError as exc:
        failure = exc
    # iter_versions checks each frame's state_size as it meets the frame, once its checksum has passed: the
    # first version over ``limit`` before the failed frame is the chain's error, as a chain without the
    # damage would raise it (its size is no claim of a damaged header: that one failed before its size counts).
    if limit is not None:
        for header, _ in parsed:
            check_state_size(header, limit)
    if failure is not None:
        # iter_versions meets the failed frame after reading the ones before it: read them too (within
        # ``max_output``; else the failed frame's error stands) so that damage to an earlier one is named.
        if parsed and (max_output is None or sum(header.content_size for header, _ in parsed) <= max_output):
            for _ in _versions(parsed):
                pass
        raise failure
    if max_output is not None:
        check_output(sum(header.content_size for header, _ in parsed), max_output, parsed[-1][0].version)
    state = b""
    for found in _versions(parsed):
        state = found.state
    return state


def iter_versions(frames: Iterable[FrameBytes], *, max_state_bytes: int | None = None) -> Iterator[DecodedVersion]:
    """Yield every version of a chain in order, each state verified against its header.

    ``max_state_bytes`` as for :func:`decode`, checked frame by frame: the
    versions before the first one over the limit are yielded, then
    StateTooLargeError is raised without decompressing that frame.
    """
    check_chain_arg(frames)
    yield from _versions(_linked(frames, check_limit(max_state_bytes)))


def _linked(frames: Iterable[FrameBytes], limit: int | None) -> Iterator[tuple[FrameHeader, memoryview]]:
    """Each frame parsed, once its header is checked, linked to the one before it and within ``limit``."""
    prev: FrameHeader | None = None
    # The frames from the last that is not a PATCH on: a segment read after the version before it is based
    # on one of them.
    run: list[FrameHeader] = []
    for frame in frames:
        # A frame whose magic, format or version field is unreadable is named by its place in the chain.
        header, payload = parse_named(
            frame, "first frame of the chain" if prev is None else f"frame of version {prev.version + 1}"
        )
        check_link(prev, header, run)
        if header.kind is not FrameKind.PATCH:
            run = []
        run.append(header)
        if limit is not None:
            check_state_size(header, limit)
        yield header, payload
        prev = header


def _versions(frames: Iterable[tuple[FrameHeader, memoryview]]) -> Iterator[DecodedVersion]:
    """Every version of a chain of linked frames, one payload fed to its stream's decompressor at a time."""
    state = b""
    reader: _zstd.ZstdDecompressor | None = None
    for header, payload in frames:
        if header.sealed:  # FULL: one zstd frame, its stream ended (no frame continues it: check_link)
            content = decompress_sealed(
                payload, version=header.version, size=header.state_size, window_log=header.window_log
            )
            reader = None
        else:
            if header.kind is FrameKind.PATCH and header.base_size != len(state):
                state = state[: header.base_size]  # a segment after the version before it: check_link
            if not header.continues_stream:
                reader = _zstd.new_reader(window_log=header.window_log, prefix=_prefix_of(header, state))
            assert reader is not None  # check_link refuses a chain starting with a continuation
            content = _decompress(reader, payload, header.content_size, header)
        state = state + content if header.kind is FrameKind.PATCH else content
        _verify_state(header, state)
        yield DecodedVersion(header, state)


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
    if reader.eof:
        # The writer never ends a stream (FORMAT.md §4): whatever the end
        # leaves out (bytes after it, frames continuing the stream) would go unread.
        after = len(reader.unused_data)
        raise DecodeError(
            f"zstd stream of version {header.version} ends in its {len(data)}-byte payload"
            f"{f' ({after} bytes after the end)' if after else ''}; a ckpt stream never ends its zstd frame"
        )
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
