"""Reading chains: a version's state from the frames table, the frames behind it, a session's frames.

A session's frames are one contiguous key range (keys.frame_key), so a
version's chain is a backward scan from its frame to the FULL frame that
starts it: one read of the storage, then one decode.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from itertools import chain
from typing import NoReturn

from ckpt.store.v1 import records_pb2

from ...codec import (
    DecodedVersion,
    DecodeError,
    FrameKind,
    StateTooLargeError,
    TruncatedFrameError,
    decode_latest,
    decode_sealed,
    frame_kind,
    prefix_state,
    sealed_prefix,
)
from ...codec.frame_v2 import segment_distance
from ..errors import DataLoss, NotFound, StateTooLarge
from ..storage import ReadTxn, Table, WriteTxn
from . import keys
from .args import MAX_INT, check_int_arg
from .blobs import references_blobs
from .layout import Tables
from .prefixes import CHAIN_ENDS_V2, SEALED_FULL_V2, is_prefix, named, source_of
from .records import frame_of, record, session_info, version_info
from .types import GetResult, SessionInfo, VersionInfo

#: The kind_flags byte of a format 2 PATCH frame that starts a stream: a segment is one of them.
_PATCH_STARTING = FrameKind.PATCH.value
# The byte after keys.SEP: a session's frame keys all sort before sid + AFTER_SEP.
AFTER_SEP = bytes([keys.SEP[0] + 1])
# Session ids read per read transaction when every one is listed.
_IDS_CHUNK = 1000


def check_version_arg(version: int) -> None:
    check_int_arg("version", version, means="0 = latest")


def read_state(
    txn: ReadTxn, tables: Tables, sid: bytes, session_id: str, version: int, *, max_state_bytes: int | None = None
) -> GetResult:
    """The state of ``version`` (0: the head), verified; its ``info`` read from its stored value when asked.

    ``max_state_bytes``: StateTooLarge, before anything is decompressed, if the chain makes a larger state
    (for a PREFIX version: the chain of the newer version it is read from, prefixes.read_prefixed).
    """
    check_int_arg("max_state_bytes", max_state_bytes, most=MAX_INT, optional=True)
    if not version and (sealed := _sealed_head(txn, tables.frames, sid, session_id, max_state_bytes)) is not None:
        return sealed
    found = chain_back(txn, tables.frames, sid, session_id, version)
    if found is None:  # no frame stored for it: the session record says why
        refuse_unstored(txn, tables, sid, session_id, version)
    target, value, frames = found
    if len(frames) == 1 and is_prefix(frames[0]):  # a version of a folded run: read from its source
        got = read_prefixed(txn, tables.frames, sid, session_id, target, frames[0], max_state_bytes=max_state_bytes)
        return _result(session_id, target, value, got)
    try:
        head = decode_latest(frames, max_state_bytes=max_state_bytes)
    except StateTooLargeError as exc:
        raise StateTooLarge(f"session {session_id!r} version {target}: {exc}") from None
    except DecodeError as exc:
        raise DataLoss(f"session {session_id!r} version {target}: {exc}") from None
    return _result(session_id, target, value, head)


def _sealed_head(
    txn: ReadTxn, frames_table: Table, sid: bytes, session_id: str, max_state_bytes: int | None
) -> GetResult | None:
    """The head, if its frame is one sealed FULL frame (a quiet session's folded head: most cold reads),
    read with one cursor step and decoded in one shot; None for any other head, or on any doubt: the chain
    read then decides, and names the error. The general path costs this read a fifth more (a scan's
    iterator, the chain bookkeeping) for the same frame."""
    found = sealed_head(txn, frames_table, sid, max_state_bytes)
    return None if found is None else _result(session_id, *found)


def sealed_head(
    txn: ReadTxn, frames_table: Table, sid: bytes, max_state_bytes: int | None
) -> tuple[int, bytes, DecodedVersion] | None:
    """The head's version, stored value and decoded frame, if that frame is one sealed FULL frame; None
    otherwise (see _sealed_head). The frame's own version is not checked against the key's here."""
    last = txn.last_before(frames_table, sid + AFTER_SEP)
    if last is None:
        return None
    key, value = last
    if not key.startswith(sid + keys.SEP):
        return None
    frame = frame_of(value)
    if frame[2:4] != SEALED_FULL_V2:
        return None
    head = decode_sealed(frame, max_state_bytes=max_state_bytes)
    if head is None:
        return None
    return keys.frame_version(key, sid), value, head


def _result(session_id: str, version: int, value: bytes, got: DecodedVersion) -> GetResult:
    """``got``, read from the frame stored as ``version``, as that version's result: refused (DataLoss) if
    the frame is another version's; the metadata in ``value`` parsed only when the info is asked for."""
    check_frame_version(session_id, version, got)
    # LMDB hands back bytes (buffers=False): the value outlives the read transaction.
    return GetResult(version, got.state, read_info=partial(version_info, session_id, version, value, header=got.header))


def check_frame_version(session_id: str, version: int, got: DecodedVersion) -> None:
    """DataLoss if ``got``, read from the frame stored as ``version``, is another version's: a sound frame
    under another version's key is never served as this one."""
    if got.header.version != version:
        raise DataLoss(
            f"session {session_id!r} version {version}: the frame stored there is version {got.header.version}'s"
        )


def chain_back(
    txn: ReadTxn,
    frames_table: Table,
    sid: bytes,
    session_id: str,
    version: int,
    *,
    consecutive: bool = False,
) -> tuple[int, bytes, list[memoryview]] | None:
    """See :func:`chain_read`, without the chain's start."""
    found = chain_read(txn, frames_table, sid, session_id, version, consecutive=consecutive)
    return None if found is None else found[:3]


def chain_read(
    txn: ReadTxn,
    frames_table: Table,
    sid: bytes,
    session_id: str,
    version: int,
    *,
    consecutive: bool = False,
) -> tuple[int, bytes, list[memoryview], int] | None:
    """``version`` (0: the session's last frame, its head), its stored value, the frames it is read
    through, FULL frame first, and that FULL frame's version (by its key): read backwards from its frame
    to the FULL frame that starts its chain, jumping from a segment frame (codec FORMAT.md §14) to its
    base; ``consecutive``: every version from that FULL frame on instead (a history page decodes them
    all). None if no frame is stored for it. A
    PREFIX frame (prefixes.py) depends on no older frame: the scan stops at it too, so a PREFIX version's
    chain is its frame alone (and one met below a version's own frame, damage, fails the decode that
    follows).

    The frames table alone answers: retention and delete remove frames and
    update the session record in one transaction, so the frames stored are
    exactly versions first_version..head. A cold read then makes one B-tree
    descent (of the frames table) instead of two: its pages are what a read
    from disk waits for, and the sessions table's descent grows with the
    number of sessions.
    """
    prefix = sid + keys.SEP
    wanted = b""
    if version:
        wanted = keys.frame_key(sid, version)
        items = txn.scan_back(frames_table, wanted + b"\x00")  # from the key itself
    else:
        items = txn.scan_back(frames_table, sid + AFTER_SEP)
    first = next(items, None)
    if first is None:
        return None  # no key at all before the session's range
    key, value = first
    if (key != wanted) if version else not key.startswith(prefix):
        return None
    target = keys.frame_version(key, sid)
    frames: list[memoryview] = []
    # Versions skipped by segments: frames read since the last jump are consecutive keys, so the version of
    # the last key read is target - skipped - (frames read - 1) if none is missing (checked at each jump and
    # at the FULL frame, one key parsed, not one per frame).
    skipped = 0
    full = False
    pending: Iterator[tuple[bytes, bytes]] = chain((first,), items)
    while True:
        jump = 0
        for key, stored in pending:
            if not key.startswith(prefix):
                break
            frame = frame_of(stored)
            frames.append(frame)
            # Once per frame of every cold read: a format 2 frame says FULL (or PREFIX) in two bytes (is_full_v2,
            # is_prefix; inline here: no call per frame), so only other frames pay for frame_kind. A frame damaged
            # into looking FULL ends the chain early; decoding it then fails, naming it.
            if len(frame) > 3 and frame[2] == 2:
                if frame[3] in CHAIN_ENDS_V2:  # FULL, sealed FULL or PREFIX
                    full = True
                    break
                if frame[3] == _PATCH_STARTING and not consecutive:
                    jump = segment_distance(frame)
                    if jump > 1:
                        break
                continue
            try:
                if frame_kind(frame) is FrameKind.FULL:
                    full = True
                    break
            except TruncatedFrameError:
                raise DataLoss(
                    f"session {session_id!r} version {target - skipped - len(frames) + 1}: the stored value"
                    f" ({len(stored)} bytes) is too short to hold a frame header"
                ) from None
            except DecodeError:  # no kind this codec knows: decoding the chain names the damage
                pass
        else:
            key = b""
        at = target - skipped - len(frames) + 1  # the version of the last frame read, if none is missing
        if (full or jump > 1) and keys.frame_version(key, sid) != at:
            raise DataLoss(
                f"session {session_id!r}: the frame of version {_first_gap(txn, frames_table, sid, target)} is missing"
            )
        if full:
            frames.reverse()
            return target, value, frames, at
        if jump <= 1:
            break
        base = at - jump
        skipped += jump - 1
        if base < 1:
            raise DataLoss(f"session {session_id!r} version {at}: its frame names version {base} as its base")
        base_key = keys.frame_key(sid, base)
        pending = txn.scan_back(frames_table, base_key + b"\x00")
        head = next(pending, None)
        if head is None or head[0] != base_key:
            raise DataLoss(f"session {session_id!r}: the frame of version {base} is missing (the base of {at})")
        pending = chain((head,), pending)
    gap = _first_gap(txn, frames_table, sid, target)
    if gap > target - skipped - len(frames):  # a version missing among those read
        raise DataLoss(f"session {session_id!r}: the frame of version {gap} is missing")
    raise DataLoss(f"session {session_id!r}: no FULL frame starts the chain of version {target}")


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
    (a page's), by version: a source found there is not read again, and one decoded is added to it (the
    page's other versions of its run find it there). DataLoss names the version whose frame is damaged, or a
    source whose frame is missing. Without ``known``, a source stored as one sealed FULL frame (a folded head)
    is decoded only as far as the bytes the read takes (codec.sealed_prefix; their PREFIX frame checks them).
    """
    hops = [(version, frame)]
    at = version
    while True:
        source, size = source_of(hops[-1][1], session_id, at)
        if known is not None and source in known:
            state = known[source]
            whole = len(state)
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
            if known is None and len(frames) == 1 and frames[0][2:4] == SEALED_FULL_V2:
                # A folded head: decode only the bytes the nearest hop takes (a page keeps whole states).
                header, state = sealed_prefix(frames[0], size, max_state_bytes=max_state_bytes)
                whole = header.state_size
            else:
                latest = decode_latest(frames, max_state_bytes=max_state_bytes)
                header, state = latest.header, latest.state
                whole = len(state)
        except StateTooLargeError as exc:
            raise StateTooLarge(
                f"session {session_id!r} version {version} (read from version {source}): {exc}"
            ) from None
        except DecodeError as exc:
            raise DataLoss(named(session_id, source, exc)) from None
        if header.version != source:  # a sound frame under another version's key
            raise DataLoss(
                f"session {session_id!r} version {source}: the frame stored there is version {header.version}'s"
            )
        if known is not None:
            known[source] = state
        break
    got: DecodedVersion | None = None
    for at, at_frame in reversed(hops):
        try:
            got = prefix_state(at_frame, state, source_version=source, source_size=whole)
        except DecodeError as exc:
            raise DataLoss(named(session_id, at, exc)) from None
        state, source = got.state, at
        whole = len(state)
    assert got is not None
    return got


def _first_gap(txn: ReadTxn, frames_table: Table, sid: bytes, target: int) -> int:
    """The highest version below ``target`` with no frame stored (scanning back; an error path only)."""
    prefix = sid + keys.SEP
    expected = target
    for key, _ in txn.scan_back(frames_table, keys.frame_key(sid, target) + b"\x00"):
        if not key.startswith(prefix) or keys.frame_version(key, sid) != expected:
            break
        expected -= 1
    return expected


def no_versions(txn: ReadTxn, tables: Tables, sid: bytes, session_id: str) -> NotFound:
    """What a read of the versions of a session without a record gets: NotFound saying whether it holds
    events or blobs alone, or does not exist."""
    if tables.event_logs is not None and txn.get(sid, db=tables.event_logs) is not None:
        return NotFound(f"session {session_id!r} has no versions, only events")
    if references_blobs(txn, tables, sid):
        return NotFound(f"session {session_id!r} has no versions, only blobs")
    return NotFound(f"session {session_id!r} does not exist")


def refuse_unstored(txn: ReadTxn, tables: Tables, sid: bytes, session_id: str, version: int) -> NoReturn:
    """Raise what a read of a version with no frame stored gets: NotFound naming why, or DataLoss."""
    raw = txn.get(sid, db=tables.sessions)
    if raw is None:
        raise no_versions(txn, tables, sid, session_id)
    rec = record(raw)
    target = version or rec.head_version
    if target > rec.head_version:
        raise NotFound(f"session {session_id!r} has no version {target}; the head is version {rec.head_version}")
    if target < rec.first_version:
        raise NotFound(
            f"session {session_id!r} version {target} was removed by retention;"
            f" the oldest kept is version {rec.first_version}"
        )
    raise DataLoss(f"session {session_id!r}: the frame of version {target} is missing")


def chain_start(txn: ReadTxn, frames_table: Table, sid: bytes, session_id: str, target: int) -> int:
    """Version of the FULL frame whose chain holds ``target``, or ``target`` itself if its frame is PREFIX
    (it depends on newer frames alone); DataLoss if that chain is broken."""
    found = chain_read(txn, frames_table, sid, session_id, target)
    if found is None:
        raise DataLoss(f"session {session_id!r}: the frame of version {target} is missing")
    return found[3]


def chain_frames(
    txn: ReadTxn,
    tables: Tables,
    sid: bytes,
    session_id: str,
    rec: records_pb2.SessionRecord,
    target: int,
    *,
    consecutive: bool = False,
) -> list[memoryview]:
    """The frames target is read through, FULL frame first, read in one transaction; ``consecutive``: every
    version from its chain's start to it (a fold rewrites each). Through its segments, a large MERGE head is
    read from a few frames, and decoded without applying every segment over the versions between."""
    if not consecutive:
        found = chain_back(txn, tables.frames, sid, session_id, target)
        if found is None:
            raise DataLoss(f"session {session_id!r}: the frame of version {target} is missing")
        return found[2]
    start = rec.chain_start_version if target >= rec.chain_start_version else None
    if start is None:
        start = chain_start(txn, tables.frames, sid, session_id, target)
    frames: list[memoryview] = []
    want = target - start + 1
    start_key = key = keys.frame_key(sid, start)
    # Versions are consecutive keys, so the chain is the next `want` values;
    # checking the last key once proves none is missing (keys are unique and
    # sorted), without parsing every key on the cold path.
    for key, value in txn.scan(tables.frames, start_key):
        if not frames and key != start_key:
            break
        frames.append(frame_of(value))
        if len(frames) == want:
            break
    if len(frames) != want or key != keys.frame_key(sid, target):
        raise DataLoss(f"session {session_id!r} version {target}: a frame of its chain {start}..{target} is missing")
    return frames


def delete_frames(txn: WriteTxn, frames_table: Table, sid: bytes, *, below: int | None) -> tuple[int, int]:
    """Delete a session's frames (all, or those below a version); return how many and their frame bytes."""
    start = sid + keys.SEP
    stop = keys.frame_key(sid, below) if below is not None else sid + AFTER_SEP
    removed = freed = 0
    for key, value in txn.scan(frames_table, start):
        if key >= stop:
            break
        freed += len(frame_of(value))
        removed += 1
    if removed:
        txn.delete_range(frames_table, start, stop)
    return removed, freed


#: A stored frame as the offline tools read it: its version, what its value says (or why it does not parse),
#: and the frame's bytes.
StoredFrame = tuple[int, VersionInfo | DataLoss, bytes]


@contextmanager
def stored_frames(
    read: Callable[[], AbstractContextManager[ReadTxn]], tables: Tables, session_id: str
) -> Iterator[tuple[SessionInfo, Iterator[StoredFrame]]]:
    """A session's record and its stored frames, oldest first, read one at a time from one read transaction
    held until the block ends: a caller holds only what it keeps (`ckpt verify`: one chain at a time)."""
    sid = keys.session_key(session_id)
    with read() as txn:
        raw = txn.get(sid, db=tables.sessions)
        if raw is None:
            raise NotFound(f"session {session_id!r} does not exist")
        yield session_info(session_id, record(raw)), _stored_frames(txn, tables.frames, sid, session_id)


def _stored_frames(txn: ReadTxn, frames_table: Table, sid: bytes, session_id: str) -> Iterator[StoredFrame]:
    prefix = sid + keys.SEP
    for key, value in txn.scan(frames_table, prefix):
        if not key.startswith(prefix):
            break
        version = keys.frame_version(key, sid)
        try:
            vinfo: VersionInfo | DataLoss = version_info(session_id, version, value)
        except DataLoss as exc:
            vinfo = exc
        yield version, vinfo, bytes(frame_of(value))


def frames_of(
    read: Callable[[], AbstractContextManager[ReadTxn]], tables: Tables, session_id: str
) -> tuple[SessionInfo, list[StoredFrame]]:
    """A session's record and every stored frame, oldest first, read in one transaction (Store.frames_of)."""
    with stored_frames(read, tables, session_id) as (info, frames):
        return info, list(frames)


def session_ids(read: Callable[[], AbstractContextManager[ReadTxn]], tables: Tables) -> Iterator[str]:
    """Every session id, in key order; read a chunk at a time, holding no transaction between chunks."""
    after = b""
    while True:
        with read() as txn:
            chunk = txn.keys_after(tables.sessions, after, _IDS_CHUNK)
        # A key that is not UTF-8 is damage: yielded undecoded-as-surrogates, so
        # that verify names it (every lookup of it is refused as not UTF-8).
        yield from (k.decode("utf-8", "surrogateescape") for k in chunk)
        if len(chunk) < _IDS_CHUNK:
            return
        after = chunk[-1]
