"""`ckpt verify`'s blob checks: each blob's file against its record (size, SHA-256), and the references
against the records' counts."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import NamedTuple

from ..errors import NotFound
from ..storage import ReadTxn
from ..store import Store, keys
from ..store.blobfiles import BlobFiles
from ..store.layout import Tables

# Bytes hashed per read of a blob's file.
_READ_BYTES = 1024 * 1024


class BlobRecords(NamedTuple):
    """What the blob tables say, read in one snapshot: (sha256, size, references counted) per record,
    how many references name each blob, and how many sessions hold blob references alone."""

    records: list[tuple[str, int, int]]
    refs: dict[str, int]
    blobs_only: int = 0


def blob_records(store: Store) -> BlobRecords:
    """The blob tables of ``store`` (run in a child: tools/isolated.py)."""
    refs: Counter[str] = Counter()
    blobs_only = 0
    with store.read() as txn:
        records = [(info.sha256, info.size_bytes, info.ref_count) for info in store.blobs(txn)]
        if store.tables.blob_refs is not None:
            last = None
            for raw in txn.scan_keys(store.tables.blob_refs):
                key = bytes(raw)
                refs[key[-32:].hex()] += 1
                sid = key[: -32 - len(keys.SEP)]  # session \0 sha256 (blobs.ref_key)
                if sid != last:
                    blobs_only += _holds_blobs_alone(txn, store.tables, sid)
                    last = sid
    return BlobRecords(records, dict(refs), blobs_only)


def _holds_blobs_alone(txn: ReadTxn, tables: Tables, sid: bytes) -> bool:
    """Whether session ``sid`` (which references a blob) has neither a record, frames nor an event log: the
    per-session checks do not list it, nor do the frames and events passes count it."""
    if txn.get(sid, db=tables.sessions) is not None:
        return False
    if tables.event_logs is not None and txn.get(sid, db=tables.event_logs) is not None:
        return False
    frame = next(txn.scan_keys(tables.frames, sid + keys.SEP), None)
    return frame is None or not bytes(frame).startswith(sid + keys.SEP)


def session_blob_problems(store: Store, session: str) -> list[str]:
    """The problems of the blobs ``session`` references: each has a record, and its file that record's
    size and hash (for a session named to verify; every blob is checked by blob_problems otherwise)."""
    problems = []
    for sha256 in store.blob_refs(session):
        try:
            size = store.blob(sha256).size_bytes
        except NotFound:
            problems.append(f"blob {sha256}: the session references it, but it has no record")
            continue
        problem = _file_problem(store.blob_files, sha256, size)
        if problem is not None:
            problems.append(f"blob {sha256}: {problem}")
    return problems


def blob_problems(data_dir: Path, found: BlobRecords) -> list[tuple[str, str]]:
    """(subject, problem) for every blob whose file is missing, of another size or hash than its record,
    or whose references do not match its count."""
    files = BlobFiles(data_dir / "blobs")
    problems = []
    for sha256, size, ref_count in found.records:
        subject = f"blob {sha256}"
        if found.refs.get(sha256, 0) != ref_count:
            problems.append(
                (
                    subject,
                    f"its record counts {ref_count} references, the blob_refs table holds {found.refs.get(sha256, 0)}",
                )
            )
        problem = _file_problem(files, sha256, size)
        if problem is not None:
            problems.append((subject, problem))
    recorded = {sha for sha, _, _ in found.records}
    for sha256 in sorted(found.refs.keys() - recorded):
        problems.append((f"blob {sha256}", f"{found.refs[sha256]} references name it, but it has no record"))
    return problems


def _file_problem(files: BlobFiles, sha256: str, size: int) -> str | None:
    """What is wrong with blob ``sha256``'s file, whose record says ``size`` bytes; None if nothing."""
    path = files.path(sha256)
    try:
        actual = _hash_of(path)
    except FileNotFoundError:
        return f"its file {path} is missing"
    if actual[1] != size:
        return f"its file {path} is {actual[1]} bytes; its record says {size}"
    if actual[0] != sha256:
        return f"its file {path} hashes to {actual[0]}: it is damaged"
    return None


def _hash_of(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_READ_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size
