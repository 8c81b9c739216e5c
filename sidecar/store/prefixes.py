"""PREFIX frames: a version whose state is the first bytes of a newer version's (a folded head run).

A PREFIX frame holds no payload: its header names its source, a newer
version, and its state's size and XXH3-64. Reading it follows sources (each
hop: one B-tree descent, one header parse) until a frame that is not PREFIX,
decodes that version's chain once, then takes each prefix back down to the
version asked for, every hop's sizes and checksum checked (codec.prefix_state:
reads.read_prefixed). Sources are always newer, so following them ends (at the
head at the latest).
"""

from __future__ import annotations

from ...codec import DecodeError, parse
from ..errors import DataLoss

#: The kind_flags byte of a format 2 FULL frame (codec/FORMAT.md §9: kind_flags, FULL 1; sealed FULL 9, §13).
FULL_KINDS_V2 = frozenset((1, 9))
#: The kind_flags byte of a format 2 frame that depends on no older frame: FULL, sealed FULL or PREFIX (0, is_prefix).
CHAIN_ENDS_V2 = FULL_KINDS_V2 | {0}
#: A format 2 sealed FULL frame's format and kind_flags bytes (frame[2:4]).
SEALED_FULL_V2 = b"\x02\x09"


def is_full_v2(frame: bytes | memoryview) -> bool:
    """Whether a stored frame is a format 2 FULL frame (sealed or not), by its kind byte alone; False for a
    format 1 frame, which callers tell by its header. A frame damaged into looking FULL fails its decode,
    naming the damage."""
    return len(frame) > 3 and frame[2] == 2 and frame[3] in FULL_KINDS_V2


def is_prefix(frame: bytes | memoryview) -> bool:
    """Whether a stored frame is PREFIX, by its kind byte alone (FORMAT.md: format 2, kind_flags 0; format 1
    has none). A frame damaged into looking PREFIX fails its parse, naming the damage."""
    return len(frame) > 3 and frame[2] == 2 and frame[3] == 0


def source_of(frame: bytes | memoryview, session_id: str, version: int) -> tuple[int, int]:
    """The version a PREFIX frame's state is a prefix of, and its state's size (its header checked);
    DataLoss naming ``version``."""
    try:
        header = parse(frame)[0]
        return header.base_version, header.state_size
    except DecodeError as exc:
        raise DataLoss(named(session_id, version, exc)) from None


def named(session_id: str, version: int, exc: Exception) -> str:
    """A codec error's text for a DataLoss, naming the session and, unless it does, the version."""
    text = str(exc)
    where = f"session {session_id!r}" if f"version {version}" in text else f"session {session_id!r} version {version}"
    return f"{where}: {text}"
