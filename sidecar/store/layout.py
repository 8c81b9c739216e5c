"""Opening a store's tables, and the layout stamp that keeps an older ckpt off a newer store's data.

The tables' keys and records (keys.py, records.py) are this code's own
layout, stamped as a number in the ``meta`` table: a ckpt rolled back to an
older release must not read (or write on) a layout it does not know.
Stores written before the stamp existed are layout 1.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from ..errors import DataLoss, IncompatibleStore, StoreFull
from ..storage import ReadTxn, Storage, Table, WriteTxn
from . import keys

log = logging.getLogger("ckpt.store")

#: The layout of the tables (keys and records) this code reads and writes, stamped in the `meta` table.
#: 2: request records keyed by request id first (keys.request_key); layout 1's are still read.
#: 3: the `types` table (registered message types) and typed sessions (SessionRecord.message_type). An
#: older ckpt would take a typed session's MERGE patches unchecked, and its REPLACEs of any bytes, and
#: not compact them: every store opened writable is stamped 3, so no older ckpt writes one again.
#: 4: the event log (the `events` and `event_logs` tables, eventlog.py). An older ckpt would not delete a
#: session's events with it (a session made again under its id would find them), nor apply their retention.
#: 6: request records of hex request ids (UUIDv7, as the clients make them) keyed by the id's 16 bytes, their
#: expiry entries by the id alone (keys.request_key, keys.expiry_key); those keyed in full before are still
#: read. An older ckpt would not find the compact records: a retry across the downgrade would write twice.
#: 7: PREFIX frames (a folded head run: folds.py) and sealed FULL frames (quiet rewrites' keyframes). An older
#: ckpt would fail to read every folded or keyframed version.
#: A store is stamped 7 by the transaction of its first fold or quiet keyframe, not when opened: one never
#: so rewritten stays layout 6 (OPENED_LAYOUT), which a ckpt of layout 6 still opens.
#: 8: request records of UUIDv7 ids without an expiry entry, swept by the id's time
#: (RequestRecord.swept_by_id_time, keys.uuid7_nanos). An older ckpt would never remove them. Stamped by
#: the transaction of the first such record.
#: 9: segment frames (codec FORMAT.md §14: a PATCH frame based on an older version of its run, in a large
#: MERGE chain). An older ckpt would fail to read every version read through one. Stamped by the
#: transaction of the first segment frame.
LAYOUT_VERSION = 9
#: The layout of the frames a quiet rewrite writes (stamp_new_frames).
FRAMES_LAYOUT = 7
#: The layout of request records swept by their ids' time (RequestIds.store stamps it).
ID_TIME_RECORDS_LAYOUT = 8
#: The layout of segment frames (WriteOps stamps it with the first).
SEGMENTS_LAYOUT = 9
#: The layout a writable open stamps a store of an older layout (or none) with: the newest whose data an
#: open alone makes (layout 7's frames come with the first quiet rewrite: stamp_new_frames).
OPENED_LAYOUT = 6
#: Layouts development builds wrote and later ones withdrew: no build reads them, so none is reused (the
#: next layout is 10). 5 keyed request records by two hashes; taken out before any release.
_WITHDRAWN_LAYOUTS = {5: "request records keyed by hashes, written by development builds only and withdrawn"}
LAYOUT_KEY = b"layout_version"
#: When the last sweep began (time.time_ns(), as digits); set when a store is first opened writable.
LAST_SWEEP_KEY = b"last_sweep_unix_nanos"
#: The quiet-keyframe sweep's bound (its QuietSweep.before_nanos).
KEYFRAMED_BEFORE_KEY = b"keyframed_before_unix_nanos"
#: The fold sweep's bound (its QuietSweep.before_nanos).
FOLDED_BEFORE_KEY = b"folded_before_unix_nanos"
#: The latest time a write was stamped with (write_time, as digits): the store's times never go backwards.
WRITE_TIME_KEY = b"last_write_unix_nanos"
#: Registrations that changed the `types` table (registry.py): another process reloads it when it moved.
TYPES_GENERATION_KEY = b"types_generation"
#: Every field number each registered message has held, and its kind (registry.py): a FieldHistory.
FIELD_HISTORY_KEY = b"types_field_history"
# Keys the updated-time index rewrite reads per step of its scan.
_REWRITE_CHUNK = 1000


@dataclass(frozen=True, slots=True)
class Tables:
    """The store's tables (keys.py gives their keys); ``meta`` is None in a read-only store never stamped,
    ``types`` in a read-only store of layout 1 or 2."""

    frames: Table
    sessions: Table
    requests: Table
    req_expiry: Table
    labels: Table
    updated: Table
    meta: Table | None
    types: Table | None
    #: Blobs (blobs.py): None in a read-only store written before they existed.
    blobs: Table | None = None
    blob_refs: Table | None = None
    #: The event log (eventlog.py): None in a read-only store of layout 1-3.
    events: Table | None = None
    event_logs: Table | None = None


@dataclass(frozen=True, slots=True)
class Layout:
    """A store's tables as opened, and what its layout says."""

    tables: Tables
    #: Whether the store carries a layout stamp. One without is layout 1 as the first builds
    #: wrote it, whose updated-time index may hold exact update times: `ckpt verify` accepts those.
    stamped: bool
    #: Whether the requests table still holds records keyed as layout 1 did (see has_layout1_requests).
    layout1_requests: bool
    #: Whether it may hold records of hex request ids keyed in full (see has_hex_keyed_requests).
    hex_keyed_requests: bool = True


def open_layout(storage: Storage, *, writable: bool, max_map_size_bytes: int) -> Layout:
    """Check (writable: stamp) the layout, then open (writable: create) the tables."""
    # First: the other tables of a newer layout are not for this code to open, let alone create.
    meta, stamped = _check_layout(storage, writable=writable, max_map_size_bytes=max_map_size_bytes)
    names = ("frames", "sessions", "requests", "req_expiry", "labels", "updated")
    opened = {name: storage.table(name, create=writable) for name in names}
    for name, table in opened.items():
        if table is None:
            raise DataLoss(f"{storage.location} cannot be opened as a ckpt store: its {name!r} table is missing")
    # Registered message types (registry.py): file name -> FileDescriptorProto. Layout 3's; a read-only
    # store stamped earlier has none (and no typed session).
    types = storage.table("types", create=writable)
    # Blobs and the sessions referencing them (blobs.py). An older ckpt leaves them alone: a session it
    # deletes keeps its blobs until its id is deleted again here (stored too long, never lost).
    blobs = storage.table("blobs", create=writable)
    blob_refs = storage.table("blob_refs", create=writable)
    # The event log's blocks and per-session records: layout 4's; a read-only store stamped earlier has none.
    events = storage.table("events", create=writable)
    event_logs = storage.table("event_logs", create=writable)
    tables = Tables(
        meta=meta, types=types, blobs=blobs, blob_refs=blob_refs, events=events, event_logs=event_logs, **opened
    )
    with storage.read() as txn:
        layout1 = has_layout1_requests(txn, tables)
        hex_keyed = has_hex_keyed_requests(txn, tables)
    return Layout(tables, stamped, layout1, hex_keyed)


def _check_layout(storage: Storage, *, writable: bool, max_map_size_bytes: int) -> tuple[Table | None, bool]:
    """Refuse a store a newer ckpt wrote; stamp an older (or unstamped) one, opened writable, with this
    code's layout. The meta table (None if a read-only store has none), and whether the store is stamped."""
    while True:
        moved = 0
        try:
            meta = storage.table("meta", create=writable)
            if meta is None:  # read-only, and never stamped: layout 1
                return None, False
            # Opened before the stamp's transaction: in it, the index is rewritten only if it exists.
            updated = storage.table("updated", create=False) if writable else None
            if not writable:
                with storage.read() as txn:
                    raw = txn.get(LAYOUT_KEY, db=meta)
                break
            with storage.write() as wtxn:
                raw = wtxn.get(LAYOUT_KEY, db=meta)
                if raw is None:
                    # In the stamp's transaction: a store is stamped only with its index rewritten.
                    if updated is not None:
                        moved = _index_updated_by_granule(wtxn, updated)
                    wtxn.put(LAYOUT_KEY, b"%d" % OPENED_LAYOUT, db=meta)
                elif raw.isdigit() and int(raw) < OPENED_LAYOUT and int(raw) not in _WITHDRAWN_LAYOUTS:
                    # Layout 1 to 2 rewrites nothing (its request records are read where they are),
                    # but an older ckpt must no longer open the store: it would not find the records
                    # this one writes, and a retry across the downgrade would write twice. 2 to 3 adds
                    # the types table, created below; an older ckpt would write typed sessions unchecked. 3 to 4
                    # adds the event log's tables, which an older ckpt would leave behind a deleted session; 4
                    # to 6 keys new records of hex request ids compactly, which an older ckpt would not find.
                    # A withdrawn layout (5) is below this one, but is not upgraded: it is refused below.
                    # 6 to 7 comes with the first quiet rewrite (stamp_new_frames), not here.
                    wtxn.put(LAYOUT_KEY, b"%d" % OPENED_LAYOUT, db=meta)
                if wtxn.get(LAST_SWEEP_KEY, db=meta) is None:
                    # The sweep schedule's start (Sweeper.first_delay): once, when first opened.
                    wtxn.put(LAST_SWEEP_KEY, b"%d" % time.time_ns(), db=meta)
            break
        except storage.errors.full:
            # A compacted copy (ckpt backup) has no free pages: its map is
            # full until grown, which the writer does only later.
            if not storage.grow():
                raise StoreFull(
                    f"the store is full: {storage.location} fills max_map_size_bytes"
                    f" ({max_map_size_bytes}; ckpt serve --max-map-size-bytes), and opening it"
                    " needs a page more: raise it"
                ) from None
    if moved:
        log.info(
            "%s: the updated-time index held %d entries at exact update times (an older ckpt's); rewritten"
            " under the ~1 s granules this ckpt reads",
            storage.location,
            moved,
        )
    if raw is None:
        return meta, writable
    try:
        found = int(raw)
    except ValueError:
        raise DataLoss(f"{storage.location}: the store's layout version {raw!r} is not a number") from None
    if found in _WITHDRAWN_LAYOUTS:
        raise IncompatibleStore(
            f"{storage.location} is in store layout {found} ({_WITHDRAWN_LAYOUTS[found]}): no ckpt reads it;"
            f" restore a backup of layout {LAYOUT_VERSION} or earlier"
        )
    if found > LAYOUT_VERSION:
        raise IncompatibleStore(
            f"{storage.location} was written by a newer ckpt (store layout {found}; this ckpt reads layout"
            f" {LAYOUT_VERSION}): run that ckpt or a later one, or restore a backup this version wrote"
        )
    return meta, True


def stamp_new_frames(txn: WriteTxn, tables: Tables) -> None:
    """Stamp the store layout 7 (PREFIX frames, sealed FULL frames) in ``txn``, which writes its first ones,
    unless it is already: from that commit on, a ckpt of an older layout refuses the store rather than fail
    its reads."""
    stamp_layout(txn, tables, FRAMES_LAYOUT)


def stamp_layout(txn: WriteTxn, tables: Tables, version: int) -> bool:
    """Stamp ``version`` in ``txn``, which writes the first data of that layout, unless the store is stamped
    with it or a later one already (then True: nothing to write)."""
    meta = tables.meta
    assert meta is not None, "a writable store has a meta table"
    raw = txn.get(LAYOUT_KEY, db=meta)
    if raw is None or not raw.isdigit() or int(raw) < version:
        txn.put(LAYOUT_KEY, b"%d" % version, db=meta)
        return False
    return True


def _index_updated_by_granule(txn: WriteTxn, updated: Table) -> int:
    """Key the updated-time index by granule where it holds exact times; the number of entries moved.

    The first builds (before the layout stamp) keyed each session at its exact
    update time. This code keys it at the granule (keys.updated_key) and moves
    or deletes only that key, so such an entry would stay behind as a stale
    duplicate once the session is written, deleted or forked onto: listings by
    update time gave the session twice, and `ckpt verify` failed every session.
    A store is stamped once this has run (in the stamp's transaction), so it
    runs once per store. An entry moves to an earlier key, behind the scan.
    """
    moved = 0
    after = b""
    while chunk := txn.keys_after(updated, after, _REWRITE_CHUNK):
        for key in chunk:
            when = keys.time_of(key) if len(key) > 8 else 0
            if keys.updated_granule(when) == when:
                continue
            txn.delete(key, db=updated)
            txn.put(keys.updated_key(when, key[8:]), b"", db=updated)
            moved += 1
        after = chunk[-1]
    return moved


def write_time(txn: WriteTxn, tables: Tables) -> int:
    """The time a write in ``txn`` is stamped with (a version's creation, a session's update, a blob
    reference): the wall clock, or 1 ns past the latest time the store stamped if the clock is not past it.

    A wall clock steps back (NTP, a restored VM snapshot): stamped as read, a write would look older than
    writes made before it, and retention (blob references against versions) and listings by update time
    (a position in the updated-time index) order writes by these times. Kept in the meta table and read in
    the write transaction, so that every process writing the store (ckpt serve --workers) follows it. A
    store that never kept it starts from its updated-time index's latest granule.
    """
    now = time.time_ns()
    meta = tables.meta
    assert meta is not None, "a writable store has a meta table"
    raw = txn.get(WRITE_TIME_KEY, db=meta)
    last = 0
    if raw is not None and raw.isdigit():
        last = int(raw)
    elif raw is None:
        newest = next(txn.scan_back(tables.updated), None)
        last = keys.time_of(newest[0]) if newest is not None and len(newest[0]) >= 8 else 0
    if now <= last:
        now = min(last + 1, keys.MAX_TIME_NANOS)
    txn.put(WRITE_TIME_KEY, b"%d" % now, db=meta)
    return now


def has_layout1_requests(txn: ReadTxn, tables: Tables) -> bool:
    """Whether the requests table holds records keyed as store layout 1 did (session first).

    Such keys sort after every current one (see keys.py). Writes look them up only while
    some remain: no ckpt writes them any more (an older one cannot open this layout),
    and the sweeper expires them within request_id_ttl_seconds of the last one written.
    """
    return next(txn.scan_keys(tables.requests, keys.LAYOUT1_REQUEST_KEYS_START), None) is not None


def has_hex_keyed_requests(txn: ReadTxn, tables: Tables) -> bool:
    """Whether the requests table may hold records of hex request ids keyed in full, as builds before
    layout 6 keyed them (keys.hex_request_key): any key of the full form whose id begins with 0..f in ASCII
    order (every hex digit among them).

    Writes of hex ids look under that key too while one may remain; the sweeper expires the last within
    request_id_ttl_seconds of the upgrade, unless ids of other forms beginning so remain (a lookup more).
    """
    first = next(txn.scan_keys(tables.requests, keys.REQUEST_KEY_MARK + b"0"), None)
    return first is not None and first < keys.REQUEST_KEY_MARK + b"g"


def meta_int(read: Callable[[], AbstractContextManager[ReadTxn]], tables: Tables, key: bytes) -> int:
    """A number the meta table holds under ``key``; 0 if it holds none (or an unreadable one)."""
    if tables.meta is None:
        return 0
    with read() as txn:
        found = txn.get(key, db=tables.meta)
    if found is None:
        return 0
    try:
        return int(found)
    except ValueError:
        log.warning("the meta table's %r is not a number (%r): taken as 0", key, found)
        return 0
