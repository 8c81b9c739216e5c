"""A chain's latest state, kept with its live zstd stream so that the versions written after it cost only
their own frames.

A reader that decodes a session's head and later finds the head moved on
would decode the whole chain again from its FULL frame (300-1000 us for a
LangGraph thread's 30-330 KB state). Continuing frames are blocks of the
same zstd frame as the ones before them (FORMAT.md), and a
ZstdDecompressor keeps its window between calls while that frame has not
ended: so a ChainReader keeps the state, the last frame's header and the
decompressor, and :meth:`ChainReader.advance` feeds it only the new frames'
payloads.

advance() trusts nothing it is given: it makes every check decode()'s first
pass makes (links, kinds, sizes, window) and returns a state only if its
size and xxh3 are the last header's. Anything else, it answers None and the
reader is spent; the caller decodes the chain whole, which names any damage.

A chain whose last frame is a sealed FULL frame (a keyframe, FORMAT.md §13)
has no live stream: its reader holds the state alone, and advances by frames
that start a new stream (what a writer appends after a keyframe); a frame
continuing the sealed stream does not advance it (None, and it is spent).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from . import _zstd
from .chainchecks import check_chain_arg, check_limit
from .decoder import (
    _DELTA_CONTINUING,
    _PATCH,
    _PATCH_CONTINUING,
    _SCANNERS,
    _U64,
    DecodedVersion,
    _latest_checked,
    latest_with_reader,
    linked_content,
    scanned_header,
)
from .errors import OutputTooLargeError
from .frame import parse, state_checksum
from .pieces import StatePieces
from .sealed import FrameBytes

_NO_LIMIT = 1 << 64


class ChainReader:
    """The latest version of a chain and what continuing it needs: see :func:`open_chain`.

    Not thread-safe (one decompressor); its state is immutable bytes, safe to hand out.
    """

    __slots__ = ("_decompressor", "_latest", "_limit", "_spent")

    def __init__(self, latest: DecodedVersion, decompressor: _zstd.ZstdDecompressor | None, limit: int | None) -> None:
        self._latest = latest
        #: None: the last stream is a sealed FULL frame's, which no frame continues.
        self._decompressor = decompressor
        self._limit = _NO_LIMIT if limit is None else limit
        self._spent = False

    @property
    def latest(self) -> DecodedVersion:
        """The version read last (at open, or by the last advance that returned it)."""
        return self._latest

    @property
    def version(self) -> int:
        return self._latest.header.version

    @property
    def window_log(self) -> int:
        """log2 of the window the live stream's decompressor may hold: what keeping the reader costs
        besides its state. After a sealed FULL frame (no live stream) the window its header records, which
        the stream a writer starts next is about as large as."""
        return self._latest.header.window_log

    @property
    def spent(self) -> bool:
        """Whether an advance failed: the decompressor may have taken part of a stream, so it answers
        nothing more."""
        return self._spent

    def advance(self, frames: Sequence[FrameBytes], *, max_output_bytes: int | None = None) -> DecodedVersion | None:
        """The version of ``frames``' last frame, ``frames`` being the versions right after :attr:`version`
        in order; None for no frames (the reader stays as it was), or if any check fails (then, and from
        then on, the reader is spent), or if ``frames``
        would output more than ``max_output_bytes`` (their patches, and each DELTA's whole state), found
        from their headers before anything is decompressed.

        A frame that starts a new stream (a PATCH or DELTA frame without the continuing flag) is decoded
        from the state before it, as decode() does; a FULL frame starts a new chain: None. As in decode(),
        the states between are not checked one by one: the last one's size and xxh3 stand for them.
        """
        if not frames:  # no version to answer; the reader stays where it is, unspent
            return None
        if self._spent:
            return None
        decompressor, self._decompressor, self._spent = self._decompressor, None, True
        try:
            found = self._advanced(decompressor, frames, _NO_LIMIT if max_output_bytes is None else max_output_bytes)
        except Exception:  # a frame too short or of an unknown format: the caller decodes whole
            return None
        if found is None:
            return None
        self._latest, self._decompressor = found
        self._spent = False
        return found[0]

    def _advanced(
        self, decompressor: _zstd.ZstdDecompressor | None, frames: Sequence[FrameBytes], max_output: int
    ) -> tuple[DecodedVersion, _zstd.ZstdDecompressor] | None:
        # decoder.latest_with_reader's loop, starting inside the current stream.
        scanners, limit = _SCANNERS, self._limit
        head = self._latest.header
        # After a sealed FULL frame no frame continues the stream: no window_log (a byte) is -1.
        prev_wl = head.window_log if decompressor is not None else -1
        prev_version, prev_size, prev_xxh3 = head.version, head.state_size, head.state_xxh3
        # Streams to feed: (decompressor or None for a new one, window_log, prefix size, payloads, output size,
        # offset of the last whole state in the output or -1 if only patches, bytes of the state before it
        # that a stream of patches extends or -1 for all of it).
        streams: list[tuple[_zstd.ZstdDecompressor | None, int, int, list[FrameBytes], int, int, int]] = []
        current: _zstd.ZstdDecompressor | None = decompressor
        stream_wl, stream_prefix, parts, total, whole, keep = prev_wl, 0, [], 0, -1, -1
        kf = wl = version = distance = state_size = base_size = prefix = payload_size = 0
        base_xxh3 = -1
        f: FrameBytes = b""
        for f in frames:
            kf, wl, version, distance, state_size, base_size, prefix, payload_size, xxh3_at, start, base_xxh3 = (
                scanners[f[2]](f)
            )
            if distance > 1 and version == prev_version + 1:
                # A segment after the version before it: its base's state is the first base_size bytes of
                # that one's (the state's xxh3 checks it). An equal size is no segment: damage, or a run of
                # empty patches, which the caller's whole decode reads.
                if kf != _PATCH or base_size >= prev_size:
                    return None
                prev_version, prev_size = version - distance, base_size
            content = linked_content(
                kf, wl, version, distance, state_size, base_size, prefix, len(f) - start, payload_size,
                prev_version, prev_size, prev_wl, limit,
            )  # fmt: skip
            max_output -= content
            if content < 0 or max_output < 0:
                return None
            if kf == _PATCH_CONTINUING:
                parts.append(f[start:])
            elif kf == _DELTA_CONTINUING:
                whole = total
                parts.append(f[start:])
            else:  # a PATCH or DELTA starts a stream
                streams.append((current, stream_wl, stream_prefix, parts, total, whole, keep))
                current, stream_wl, stream_prefix = None, wl, prefix
                parts, total, whole, keep = [f[start:]], 0, -1 if kf == _PATCH else 0, base_size
            if base_xxh3 >= 0 and base_xxh3 != prev_xxh3:
                return None  # a format 1 frame's link to its base's xxh3
            total += content
            prev_version, prev_size, prev_wl, prev_xxh3 = version, state_size, wl, _U64.unpack_from(f, xxh3_at)[0]
        streams.append((current, stream_wl, stream_prefix, parts, total, whole, keep))
        pieces = StatePieces(self._latest.state)
        reader = decompressor
        for kept, stream_wl, prefix_size, payloads, size, whole, keep in streams:
            if not payloads:  # the first new frame started a stream: the current one has no new blocks
                continue
            if keep < 0:
                keep = pieces.size
            if keep > pieces.size:
                return None
            # A segment extends the first bytes of the state before it, its base's (FORMAT.md §14).
            pieces.cut(keep)
            if kept is None:  # a new stream (the first one continues the live stream, or has no payloads)
                if prefix_size > keep:
                    return None
                prefix_bytes = pieces.tail(prefix_size) if prefix_size else None
                reader = _zstd.new_reader(window_log=stream_wl, prefix=prefix_bytes)
            else:
                reader = kept
            out = reader.decompress(payloads[0] if len(payloads) == 1 else b"".join(payloads), max_length=size + 1)
            # A stream the payloads ended (or left with input pending) cannot be continued.
            if len(out) != size or reader.eof or not reader.needs_input:
                return None
            if whole >= 0:
                pieces.replace(out[whole:])
            else:
                pieces.add(out)
        state = pieces.join()
        if len(state) != prev_size or state_checksum(state) != prev_xxh3 or reader is None:
            return None
        header = scanned_header(
            kf, wl, version, distance, state_size, base_size, prefix, payload_size, prev_xxh3, base_xxh3, f
        )
        return DecodedVersion(header, state), reader


def open_chain(
    frames: Iterable[FrameBytes], *, max_state_bytes: int | None = None, max_output_bytes: int | None = None
) -> tuple[DecodedVersion, ChainReader | None]:
    """:func:`decode_latest` (same result, same errors), with a reader to continue the chain from it; None
    when the chain decodes only frame by frame (decode_latest's checked pass), which keeps no stream. A
    chain ending in a sealed FULL frame has a reader too, without a live stream: it advances by frames
    starting a new stream.

    ``max_state_bytes`` bounds the versions the reader advances to as well. ``max_output_bytes`` bounds
    the work of this decode (not the reader's advances, which take their own): OutputTooLargeError,
    before anything is decompressed, if the chain's frames output more (the FULL frame's state, each
    PATCH's patch, each DELTA's whole state), as their headers declare.
    """
    check_chain_arg(frames)
    limit = check_limit(max_state_bytes)
    max_output = check_limit(max_output_bytes, "max_output_bytes")
    chain = list(frames)
    if not chain:
        raise ValueError("decode needs at least one frame")
    try:
        found = latest_with_reader(chain, limit, max_output)
    except OutputTooLargeError:
        raise
    except Exception:  # whatever the first pass tripped on, the checked pass below names it
        found = None
    if found is None:
        state = _latest_checked(chain, limit, max_output)
        return DecodedVersion(parse(chain[-1])[0], state), None
    latest, decompressor = found  # None after a sealed FULL frame: no live stream
    return latest, ChainReader(latest, decompressor, limit)
