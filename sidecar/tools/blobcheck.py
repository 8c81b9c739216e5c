"""`ckpt verify`'s blob checks: each blob's file against its record (size, SHA-256), and the references
against the records' counts.

Beside a running sidecar a blob's record and file change while verify reads
them: the records are read in one snapshot, the files after it, and a blob
whose last session is deleted meanwhile loses its file (after the commit
that drops its record: blobs.py). A file found missing or wrong is therefore
looked up again in a fresh snapshot (:func:`confirmed`): a blob no longer
recorded is not reported, and one recorded again since (deleted and stored
anew: a new record, stamped later) has the file that record names checked. A
problem is reported once the record it was found under still stands: a
record that stands keeps its file in place (files are moved in before their
record commits, and removed only once no record names them), so its file
missing, of another size or hashing otherwise is damage.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import NamedTuple

from ckpt.store.v1 import records_pb2

from ..errors import NotFound
from ..store import Store, keys
from ..store.blobfiles import BlobFiles
from ..store.blobs import holds_blobs_alone
from ..store.records import printable

# Bytes hashed per read of a blob's file.
_READ_BYTES = 1024 * 1024


#: Looks blobs up afresh (a new snapshot): (size, created_unix_nanos) of each of those still recorded.
Lookup = Callable[[list[str]], "dict[str, tuple[int, int]]"]
#: What is wrong with a blob's file, given its record's size (None: nothing); for backup, copying it.
FileCheck = Callable[[str, int], "str | None"]
#: How many times a blob is looked up again while it keeps being deleted and stored anew under verify.
_RECHECKS = 20


class BlobRecords(NamedTuple):
    """What the blob tables say, read in one snapshot: (sha256, size, references counted, created_unix_nanos)
    per record, how many references name each blob, and how many sessions hold blob references alone."""

    records: list[tuple[str, int, int, int]]
    refs: dict[str, int]
    blobs_only: int = 0
    #: (sha256, session id as printed) of each reference whose record does not parse.
    unparsed: tuple[tuple[str, str], ...] = ()


def blob_records(store: Store) -> BlobRecords:
    """The blob tables of ``store`` (run in a child: tools/isolated.py)."""
    refs: Counter[str] = Counter()
    blobs_only = 0
    unparsed: list[tuple[str, str]] = []
    with store.read() as txn:
        records = [(info.sha256, info.size_bytes, info.ref_count, info.created_unix_nanos) for info in store.blobs(txn)]
        if store.tables.blob_refs is not None:
            last = None
            for raw, value in txn.scan(store.tables.blob_refs):
                key = bytes(raw)
                refs[key[-32:].hex()] += 1
                sid = key[: -32 - len(keys.SEP)]  # session \0 sha256 (blobs.ref_key)
                if sid != last:
                    blobs_only += holds_blobs_alone(txn, store.tables, sid)
                    last = sid
                try:
                    records_pb2.BlobRefRecord.FromString(bytes(value))
                except Exception:
                    unparsed.append((key[-32:].hex(), printable(sid)))
    return BlobRecords(records, dict(refs), blobs_only, tuple(unparsed))


def session_blob_problems(store: Store, session: str) -> list[str]:
    """The problems of the blobs ``session`` references: each has a record, and its file that record's
    size and hash (for a session named to verify; every blob is checked by blob_problems otherwise)."""
    files = store.blob_files
    unrecorded: list[str] = []
    found: dict[str, tuple[str, int | None]] = {}
    for sha256 in store.blob_refs(session):
        try:
            info = store.blob(sha256)
        except NotFound:
            unrecorded.append(sha256)
            continue
        problem = _file_problem(files, sha256, info.size_bytes)
        if problem is not None:
            found[sha256] = (problem, info.created_unix_nanos)
    if unrecorded:  # read again: the session may have been deleted, or the blob stored again, meanwhile
        still = set(store.blob_refs(session)) - set(blob_lookup(store, unrecorded))
        unrecorded = [sha256 for sha256 in unrecorded if sha256 in still]
    problems = [f"blob {sha256}: the session references it, but it has no record" for sha256 in unrecorded]
    wrong = confirmed(found, partial(_file_problem, files), partial(blob_lookup, store))
    return problems + [f"blob {sha256}: {problem}" for sha256, problem in sorted(wrong.items())]


def blob_lookup(store: Store, shas: list[str]) -> dict[str, tuple[int, int]]:
    """(size, created_unix_nanos) of each of ``shas`` that has a record now (a :data:`Lookup`)."""
    found = {}
    for sha256 in shas:
        try:
            info = store.blob(sha256)
        except NotFound:
            continue
        found[sha256] = (info.size_bytes, info.created_unix_nanos)
    return found


def blob_problems(data_dir: Path, found: BlobRecords, lookup: Lookup) -> list[tuple[str, str]]:
    """(subject, problem) for every blob whose file is missing, of another size or hash than its record,
    or whose references do not match its count. ``lookup``: the blobs' records afresh, to confirm a file's
    problem (see :func:`confirmed`)."""
    files = BlobFiles(data_dir / "blobs")
    problems: dict[str, list[str]] = {}
    suspect: dict[str, tuple[str, int | None]] = {}
    for sha256, size, ref_count, created in found.records:
        if found.refs.get(sha256, 0) != ref_count:
            problems.setdefault(sha256, []).append(
                f"its record counts {ref_count} references, the blob_refs table holds {found.refs.get(sha256, 0)}"
            )
        problem = _file_problem(files, sha256, size)
        if problem is not None:
            suspect[sha256] = (problem, created)
    for sha256, problem in confirmed(suspect, partial(_file_problem, files), lookup).items():
        problems.setdefault(sha256, []).append(problem)
    recorded = {sha for sha, _, _, _ in found.records}
    for sha256 in sorted(found.refs.keys() - recorded):
        problems[sha256] = [f"{found.refs[sha256]} references name it, but it has no record"]
    for sha256, session in found.unparsed:
        problems.setdefault(sha256, []).append(f"session {session!r}'s reference to it does not parse")
    return [(f"blob {sha256}", problem) for sha256 in sorted(problems) for problem in problems[sha256]]


def confirmed(found: dict[str, tuple[str, int | None]], check: FileCheck, lookup: Lookup) -> dict[str, str]:
    """Of the problems ``found`` (sha256 -> (problem, the created_unix_nanos of the record it was found
    under, None if not known)), those that stand, each once its record is looked up again unchanged.

    Each blob is looked up (``lookup``) after its file was checked. No record: it was released meanwhile
    (its file goes after the record), not reported. The same record (created at the same time: a record
    deleted and stored again is stamped later, layout.write_time): it stood from the first check to this
    lookup, and kept its file in place throughout, so the problem stands. Another record (or none known):
    ``check`` its file again, against that record, and look it up once more if it fails again.
    """
    standing: dict[str, str] = {}
    for _ in range(_RECHECKS):
        if not found:
            break
        now = lookup(sorted(found))
        again: dict[str, tuple[str, int | None]] = {}
        for sha256, (problem, created) in found.items():
            if sha256 not in now:
                continue
            size, created_now = now[sha256]
            if created_now == created:
                standing[sha256] = problem
                continue
            problem_now = check(sha256, size)
            if problem_now is not None:
                again[sha256] = (problem_now, created_now)
        found = again
    # Any left were deleted and stored anew at every lookup: written, not damaged; not reported.
    return standing


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
