"""Listings: a session's versions and the sessions (by label, update time or id prefix), a page at a time.

A page ends with the token of the next: the listing's kind, a hash of its
scope and the key to resume at. Filtered listings read an index (labels,
updated) instead of every session.
"""

from __future__ import annotations

import base64
import binascii
import heapq
import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import xxhash

from ..errors import DataLoss, InvalidArgument, StateTooLarge
from ..storage import ReadTxn
from . import keys
from .args import MAX_INT, check_int_arg, check_str_arg, check_time_filter_arg
from .blobs import ref_sessions, ref_times
from .layout import Tables
from .reads import no_versions
from .records import log_record as event_log_record
from .records import printable, record, session_info, version_info
from .types import SessionInfo, VersionInfo

log = logging.getLogger("ckpt.store")

_MAX_PAGE_SIZE = 1000
_DEFAULT_PAGE_SIZE = 100
_MAX_SCAN_PER_PAGE = 10_000

Read = Callable[[], AbstractContextManager[ReadTxn]]


def list_versions(
    read: Read,
    tables: Tables,
    session_id: str,
    *,
    page_size: int,
    page_token: str,
    max_page_bytes: int,
    start_version: int = 0,
    target_page_bytes: int = 0,
) -> tuple[list[VersionInfo], str]:
    """A page of a session's versions, newest first, and the next page's token (Store.list_versions)."""
    with read() as txn:
        page, token = version_page(
            txn,
            tables,
            session_id,
            page_size=page_size,
            page_token=page_token,
            max_page_bytes=max_page_bytes,
            start_version=start_version,
            target_page_bytes=target_page_bytes,
        )
    return [info for info, _ in page], token


def version_page(
    txn: ReadTxn,
    tables: Tables,
    session_id: str,
    *,
    page_size: int,
    page_token: str,
    max_page_bytes: int,
    start_version: int,
    with_states: bool = False,
    target_page_bytes: int = 0,
) -> tuple[list[tuple[VersionInfo, Any]], str]:
    """A page of versions, newest first, each with its stored value (valid while ``txn`` is), and the
    next page's token. ``with_states``: each version's state counts towards ``max_page_bytes`` too, and a
    first one whose state alone is over it is StateTooLarge (a page always holds one version).
    ``target_page_bytes`` (0: none) ends a page as ``max_page_bytes`` does, but a first version over it
    is listed all the same."""
    sid = keys.session_key(session_id)
    size = check_page_args(page_size, page_token, max_page_bytes)
    check_int_arg("target_page_bytes", target_page_bytes, most=MAX_INT, means="0 = none")
    budget = min((b for b in (max_page_bytes, target_page_bytes) if b), default=0)  # 0: pages not sized
    check_int_arg("start_version", start_version, means="0 = the head")
    raw = txn.get(sid, db=tables.sessions)
    if raw is None:
        raise no_versions(txn, tables, sid, session_id)
    rec = record(raw)
    # The session as created then: a token of one deleted since must not
    # resume the versions of a new session under the same id.
    scope = sid + keys.SEP + str(rec.created_unix_nanos).encode()
    start = _decode_token(page_token, b"v", scope)
    top = min(rec.head_version, start_version) if start_version else rec.head_version
    if start:
        if not start.isdigit() or len(start) > 20:  # a u64 has at most 20 digits
            raise InvalidArgument(
                f"page_token {keys.quoted(page_token)} is not a token this server issued for this listing"
            )
        top = min(top, int(start))
    out: list[tuple[VersionInfo, Any]] = []
    if top < rec.first_version:
        return out, ""
    # Versions first_version..head are consecutive keys: one that is not
    # there is damage, named as Get names it, not quietly left out.
    expected = top
    page_bytes = 0
    prefix = sid + keys.SEP
    for key, value in txn.scan_back(tables.frames, keys.frame_key(sid, top) + b"\x00"):
        if not key.startswith(prefix) or expected < rec.first_version:
            break
        version = keys.frame_version(key, sid)
        if version != expected:
            break
        if len(out) == size:
            return out, _encode_token(b"v", scope, str(version).encode())
        info = version_info(session_id, version, value)
        # A page keeps one version whatever its size: only a state over the limit itself is refused,
        # as Get refuses it. Its metadata fits the envelope the caller keeps clear above the limit.
        if max_page_bytes and not out and with_states and info.state_size > max_page_bytes:
            raise StateTooLarge(
                f"session {session_id!r} version {version}: its state is {info.state_size} bytes, more than"
                f" the {max_page_bytes} bytes a page of versions with their states holds (max_state_bytes);"
                " read it alone with Get"
            )
        if budget:
            page_bytes += version_info_bytes(info, with_state=with_states)
            if out and page_bytes > budget:
                return out, _encode_token(b"v", scope, str(version).encode())
        out.append((info, value))
        expected -= 1
    if expected >= rec.first_version:
        raise DataLoss(f"session {session_id!r}: the frame of version {expected} is missing")
    return out, ""


def list_sessions(
    read: Read,
    tables: Tables,
    *,
    page_size: int,
    page_token: str,
    label_filter: dict[str, str] | None,
    updated_after_nanos: int | None,
    updated_before_nanos: int | None,
    max_page_bytes: int,
    session_id_prefix: str = "",
) -> tuple[list[SessionInfo], str]:
    """A page of sessions matching every filter, and the next page's token (Store.list_sessions)."""
    size = check_page_args(page_size, page_token, max_page_bytes)
    id_prefix = _id_prefix_arg(session_id_prefix)
    if label_filter is not None and not isinstance(label_filter, dict):
        raise InvalidArgument(f"label_filter must be a dict of str to str, not {type(label_filter).__name__}")
    labels = dict(label_filter or {})
    keys.check_labels(labels, field="label_filter")
    check_time_filter_arg("updated_after_nanos", updated_after_nanos)
    check_time_filter_arg("updated_before_nanos", updated_before_nanos)
    after = updated_after_nanos if updated_after_nanos is not None else 0
    before = updated_before_nanos if updated_before_nanos is not None else 2**63
    # Swapped bounds are a mistake, not a listing: say so rather than list none.
    if updated_after_nanos is not None and updated_before_nanos is not None and after > before:
        raise InvalidArgument(
            f"updated_after ({updated_after_nanos} ns) is later than updated_before ({updated_before_nanos} ns):"
            " no session could match; the listing is of sessions last written at or after updated_after"
            " and before updated_before"
        )
    kind = b"s" + (
        b"l" if labels else b"t" if updated_after_nanos is not None or updated_before_nanos is not None else b""
    )
    # A token resumes the listing it came from only: same index, same filters.
    filters = (sorted(labels.items()), updated_after_nanos, updated_before_nanos)
    # Without a prefix, the scope (and so the tokens) of the listings that came before prefixes.
    scope = repr((*filters, id_prefix) if id_prefix else filters).encode()
    resume = _decode_token(page_token, kind, scope)
    if labels:
        first_key = min(labels)
        prefix = keys.label_prefix(first_key, labels[first_key])
        # The label's entries are in session id order: those of the prefix are a range of them.
        db, lo, hi = tables.labels, prefix + id_prefix, _past(prefix + id_prefix)

        def sid_of(key: bytes) -> bytes:
            return key[len(prefix) :]
    elif updated_after_nanos is not None or updated_before_nanos is not None:
        # Index entries hold times rounded down (keys.updated_key): start at
        # the granule holding ``after``; the exact check below does the rest.
        db, lo, hi = tables.updated, keys.updated_key(after, b""), keys.time_key(before, b"")

        def sid_of(key: bytes) -> bytes:
            return key[8:]
    else:
        # From the prefix's first id to the first id past it: the ids of the prefix alone are read.
        db, lo, hi = tables.sessions, id_prefix, _past(id_prefix)

        def sid_of(key: bytes) -> bytes:
            return key

    out: list[SessionInfo] = []
    with read() as txn:
        scanned = page_bytes = 0
        if db is tables.sessions:
            scan = _session_keys(txn, tables, max(lo, resume))
        else:
            scan = txn.scan_keys(db, max(lo, resume))
        for key in scan:
            if key >= hi:
                return out, ""
            if len(out) == size or scanned == _MAX_SCAN_PER_PAGE:
                # The next page resumes *at* this key: it was not returned yet.
                return out, _encode_token(kind, scope, key)
            scanned += 1
            sid = sid_of(key)
            if not sid.startswith(id_prefix):  # the update-time index is in time order: checked one by one
                continue
            raw = txn.get(sid, db=tables.sessions)
            try:
                session_id = sid.decode()
                if raw is None:
                    # A session of events or blobs alone (no checkpoint yet) is listed in session id order
                    # only: the label and update-time indexes are of checkpoints.
                    uncheckpointed = _uncheckpointed(txn, tables, session_id, sid) if db is tables.sessions else None
                    if uncheckpointed is None:
                        continue
                    info = uncheckpointed
                else:
                    rec = record(raw)
                    if not after <= rec.updated_unix_nanos < before:
                        continue
                    if any(rec.labels.get(k) != v for k, v in labels.items()):
                        continue
                    info = session_info(session_id, rec)
            except (DataLoss, UnicodeDecodeError) as exc:
                # One damaged session must not hide the others; `ckpt verify` names it.
                log.warning("listing skipped session %r: %s", printable(sid), exc)
                continue
            if max_page_bytes:
                page_bytes += session_info_bytes(info)
                if out and page_bytes > max_page_bytes:
                    return out, _encode_token(kind, scope, key)
            out.append(info)
    return out, ""


def _id_prefix_arg(session_id_prefix: str) -> bytes:
    """The session id prefix of a listing as UTF-8 bytes (b"": none); InvalidArgument naming the field for
    one that begins no session id: not a str, over the id limit, with a control character, not UTF-8."""
    if session_id_prefix == "":
        return b""
    return keys.session_key(session_id_prefix, field="session_id_prefix")


def _past(prefix: bytes) -> bytes:
    """The first key after every key that starts with ``prefix`` (b"" and all-0xff bytes: past every key)."""
    kept = prefix.rstrip(b"\xff")
    if not kept:
        return b"\xff" * (keys.MAX_SESSION_ID_BYTES + 1)
    return kept[:-1] + bytes([kept[-1] + 1])


def _session_keys(txn: ReadTxn, tables: Tables, start: bytes) -> Iterator[bytes]:
    """The ids of sessions with a checkpoint, an event log or a blob (the keys of the sessions and event_logs
    tables, the session ids of blob_refs'), in order, once each."""
    scans = [txn.scan_keys(tables.sessions, start)]
    if tables.event_logs is not None:
        scans.append(txn.scan_keys(tables.event_logs, start))
    if tables.blob_refs is not None:
        scans.append(ref_sessions(txn, tables.blob_refs, start))
    last = None
    for key in heapq.merge(*scans):
        if key != last:
            yield key
            last = key


def count_sessions(txn: ReadTxn, tables: Tables) -> int:
    """How many sessions an unfiltered listing lists (:func:`_session_keys`): those with a checkpoint, and
    those with an event log or blobs alone. One count and a scan of the others' ids, not of every session."""
    count = txn.count(tables.sessions)
    others: list[Iterator[bytes]] = []
    if tables.event_logs is not None:
        others.append(txn.scan_keys(tables.event_logs))
    if tables.blob_refs is not None:
        others.append(ref_sessions(txn, tables.blob_refs))
    last = None
    for sid in heapq.merge(*others):
        if sid != last and txn.get(sid, db=tables.sessions) is None:
            count += 1
        last = sid
    return count


def _uncheckpointed(txn: ReadTxn, tables: Tables, session_id: str, sid: bytes) -> SessionInfo | None:
    """How a session with no checkpoint is listed: an event log's times, else those of its blobs' references
    (the first and the latest made); None if it has neither."""
    log_record = event_log_record(txn, tables, sid)
    if log_record is not None:
        created, updated = log_record.created_unix_nanos, log_record.updated_unix_nanos
    elif tables.blob_refs is not None and (times := ref_times(txn, tables, sid)):
        created, updated = min(times), max(times)
    else:
        return None
    return SessionInfo(
        session_id=session_id,
        head_version=0,
        first_version=0,
        created_unix_nanos=created,
        updated_unix_nanos=updated,
        labels={},
        stored_bytes=0,
        version_count=0,
        forked_from_session_id="",
        forked_from_version=0,
    )


def check_page_args(page_size: int, page_token: str, max_page_bytes: int) -> int:
    """A listing's page size (page_size, capped; InvalidArgument for a page argument that is out of range)."""
    check_int_arg("page_size", page_size, most=MAX_INT, means=f"0 = {_DEFAULT_PAGE_SIZE}")
    check_str_arg("page_token", page_token)
    check_int_arg("max_page_bytes", max_page_bytes, most=MAX_INT, means="0 = no limit")
    return min(page_size or _DEFAULT_PAGE_SIZE, _MAX_PAGE_SIZE)


# What one listed entry can take in a reply, past its ids and labels: every
# integer field at its longest varint (10 bytes) with its tag, timestamps as
# sub-messages, the entry's own tag and length (ListVersionsResponse.versions,
# ListSessionsResponse.sessions).
_VERSION_INFO_FIXED_BYTES = 96
_SESSION_INFO_FIXED_BYTES = 144
# A state in its entry (VersionInfo.state): its tag and length (1 + 5: a state is < 4 GiB), and the 3 more
# bytes the entry's own length may take once the entry holds a state.
_STATE_FIELD_BYTES = 9
# Per label (a map entry): its tag and length (2 bytes: an entry is < 16 KiB), the key's tag and
# length (1: <= 63 bytes), the value's (1 + 2: <= 128 bytes).
_LABEL_ENTRY_BYTES = 8


def _labels_bytes(labels: dict[str, str]) -> int:
    return sum(len(k.encode()) + len(v.encode()) + _LABEL_ENTRY_BYTES for k, v in labels.items())


def version_info_bytes(info: VersionInfo, *, with_state: bool = False) -> int:
    """At least what ``info`` takes encoded in a listing reply (ckpt.v1.VersionInfo), ``with_state``: its
    state too."""
    state = info.state_size + _STATE_FIELD_BYTES if with_state else 0
    return _VERSION_INFO_FIXED_BYTES + _labels_bytes(info.labels) + state


def session_info_bytes(info: SessionInfo) -> int:
    """At least what ``info`` takes encoded in a listing reply (ckpt.v1.SessionInfo)."""
    ids = len(info.session_id.encode("utf-8", "surrogateescape")) + len(info.forked_from_session_id.encode())
    return _SESSION_INFO_FIXED_BYTES + ids + _labels_bytes(info.labels)


def _token_hash(scope: bytes, raw: bytes) -> bytes:
    return xxhash.xxh3_64_digest(raw, seed=xxhash.xxh3_64_intdigest(scope))


def _encode_token(kind: bytes, scope: bytes, raw: bytes) -> str:
    """A page token: the listing's kind, a hash of its scope (the session, or the filters) and resume key,
    the resume key."""
    return base64.urlsafe_b64encode(kind + b":" + _token_hash(scope, raw) + raw).decode().rstrip("=")


def _decode_token(token: str, kind: bytes, scope: bytes) -> bytes:
    """The resume key in a page token issued for this listing (kind and scope); InvalidArgument for any other.

    Tokens are not signed: the checks keep a token of one listing (another
    session's versions, other filters), or one edited by hand, from quietly
    resuming a listing elsewhere and making it look complete.
    """
    if not token:
        return b""
    try:
        raw = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    head = kind + b":"
    if not raw.startswith(head) or len(raw) < len(head) + 8:
        raise InvalidArgument(f"page_token {keys.quoted(token)} is not a token this server issued for this listing")
    resume = raw[len(head) + 8 :]
    if raw[len(head) : len(head) + 8] != _token_hash(scope, resume):
        raise InvalidArgument(
            f"page_token {keys.quoted(token)} was issued for another listing (another session, one deleted since under"
            " the same id, or other filters), or altered; a listing resumes only with the tokens it returned"
        )
    return resume


#: Page tokens of the same form for the store's other listings (eventreads.py).
encode_token = _encode_token
decode_token = _decode_token
