"""Reading PREFIX frames: a version whose state is the first bytes of a newer version's (a folded head run).

A PREFIX frame holds no payload: its header names its source, a newer
version, and its state's size and XXH3-64. Reading it follows sources (each
hop: one B-tree descent, one header parse) until a frame that is not PREFIX,
decodes that version's chain once, then takes each prefix back down to the
version asked for, every hop's sizes and checksum checked (codec.prefix_state).
Sources are always newer, so following them ends (at the head at the latest).
"""

from __future__ import annotations

from ...codec import DecodedVersion, DecodeError, StateTooLargeError, decode_latest, parse, prefix_state
from ..errors import DataLoss, StateTooLarge
from ..storage import ReadTxn, Table


def is_prefix(frame: bytes | memoryview) -> bool:
    """Whether a stored frame is PREFIX, by its kind byte alone (FORMAT.md: format 2, kind_flags 0; format 1
    has none). A frame damaged into looking PREFIX fails its parse, naming the damage."""
    return len(frame) > 3 and frame[2] == 2 and frame[3] == 0


def source_of(frame: bytes | memoryview, session_id: str, version: int) -> int:
    """The version a PREFIX frame's state is a prefix of (its header checked); DataLoss naming ``version``."""
    try:
        return parse(frame)[0].base_version
    except DecodeError as exc:
        raise DataLoss(_named(session_id, version, exc)) from None


def read_prefixed(
    txn: ReadTxn,
    frames_table: Table,
    sid: bytes,
    session_id: str,
    version: int,
    frame: memoryview,
    *,
    max_state_bytes: int | None = None,
    known: dict[int, bytes] | None = None,
) -> DecodedVersion:
    """The state of ``version``, whose stored frame is the PREFIX ``frame``, verified.

    ``max_state_bytes`` bounds the decode of the first source that is not PREFIX (the work the read does):
    StateTooLarge, before anything is decompressed, if its state is larger. ``known``: states already read
    (a page's), by version: a source found there is not read again. DataLoss names the version whose frame
    is damaged, or a source whose frame is missing.
    """
    from .reads import chain_back  # reads.py reads PREFIX frames through this module

    hops = [(version, frame)]
    at = version
    while True:
        source = source_of(hops[-1][1], session_id, at)
        if known is not None and source in known:
            state = known[source]
            break
        found = chain_back(txn, frames_table, sid, session_id, source)
        if found is None:
            raise DataLoss(
                f"session {session_id!r} version {at}: its state is a prefix of version {source}'s, whose frame"
                " is missing"
            )
        frames = found[2]
        if len(frames) == 1 and is_prefix(frames[0]):
            hops.append((source, frames[0]))
            at = source
            continue
        try:
            latest = decode_latest(frames, max_state_bytes=max_state_bytes)
        except StateTooLargeError as exc:
            raise StateTooLarge(
                f"session {session_id!r} version {version} (read from version {source}): {exc}"
            ) from None
        except DecodeError as exc:
            raise DataLoss(_named(session_id, source, exc)) from None
        if latest.header.version != source:  # a sound frame under another version's key
            raise DataLoss(
                f"session {session_id!r} version {source}: the frame stored there is version {latest.header.version}'s"
            )
        state = latest.state
        break
    got: DecodedVersion | None = None
    for at, at_frame in reversed(hops):
        try:
            got = prefix_state(at_frame, state, source_version=source)
        except DecodeError as exc:
            raise DataLoss(_named(session_id, at, exc)) from None
        state, source = got.state, at
    assert got is not None
    return got


def _named(session_id: str, version: int, exc: Exception) -> str:
    text = str(exc)
    where = f"session {session_id!r}" if f"version {version}" in text else f"session {session_id!r} version {version}"
    return f"{where}: {text}"
