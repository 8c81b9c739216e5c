"""`ckpt verify`'s check of the event log: every block of every log (or of the sessions named)."""

from __future__ import annotations

from collections.abc import Iterator

from ..storage import ReadTxn
from ..store import keys
from ..store.eventreads import check_log
from ..store.layout import Tables


def event_problems(txn: ReadTxn, tables: Tables, wanted: frozenset[bytes] | None) -> Iterator[tuple[bytes, bool, str]]:
    """Each problem of each log (eventreads.check_log: checksums, seqs without gaps, counts) as (session,
    whether it has a log record, what is wrong, naming the seq); then blocks stored with no log record."""
    logs, blocks = tables.event_logs, tables.events
    if logs is None or blocks is None:  # a read-only store of layout 1-3: no event log
        return
    sids = txn.scan_keys(logs) if wanted is None else (sid for sid in sorted(wanted) if txn.get(sid, db=logs))
    for raw_sid in sids:
        sid = bytes(raw_sid)
        prefix = f"session {sid.decode('utf-8', 'backslashreplace')!r} "
        for text in check_log(txn, tables, sid):
            yield sid, True, text.removeprefix(prefix)
    if wanted is not None:
        return
    after = b""
    while (key := next(txn.scan_keys(blocks, after + b"\x01" if after else b""), None)) is not None:
        sid = bytes(key).partition(keys.SEP)[0]
        if txn.get(sid, db=logs) is None:
            yield sid, False, "event blocks are stored, but the session has no event log record"
        after = sid


def events_only_sessions(txn: ReadTxn, tables: Tables) -> int:
    """How many sessions hold events alone: an event log record, and neither a session record nor frames (one
    with frames and no record is the frames pass's, counted as a session there). The per-session checks
    list the sessions table, so verify counts these among the sessions it checked: their logs are checked here."""
    logs = tables.event_logs
    if logs is None:
        return 0
    count = 0
    for raw_sid in txn.scan_keys(logs):
        sid = bytes(raw_sid)
        if txn.get(sid, db=tables.sessions) is not None:
            continue
        frame = next(txn.scan_keys(tables.frames, sid + keys.SEP), None)
        count += frame is None or not bytes(frame).startswith(sid + keys.SEP)
    return count
