"""`ckpt verify`'s blob checks: each blob's file against its record (size, SHA-256), and the references
against the records' counts."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import NamedTuple

from ..store import Store
from ..store.blobfiles import BlobFiles

# Bytes hashed per read of a blob's file.
_READ_BYTES = 1024 * 1024


class BlobRecords(NamedTuple):
    """What the blob tables say, read in one snapshot: (sha256, size, references counted) per record,
    and how many references name each blob."""

    records: list[tuple[str, int, int]]
    refs: dict[str, int]


def blob_records(store: Store) -> BlobRecords:
    """The blob tables of ``store`` (run in a child: tools/isolated.py)."""
    refs: Counter[str] = Counter()
    with store.read() as txn:
        records = [(info.sha256, info.size_bytes, info.ref_count) for info in store.blobs(txn)]
        if store.tables.blob_refs is not None:
            for key in txn.scan_keys(store.tables.blob_refs):
                refs[key[-32:].hex()] += 1
    return BlobRecords(records, dict(refs))


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
        path = files.path(sha256)
        try:
            actual = _hash_of(path)
        except FileNotFoundError:
            problems.append((subject, f"its file {path} is missing"))
            continue
        if actual[1] != size:
            problems.append((subject, f"its file {path} is {actual[1]} bytes; its record says {size}"))
        elif actual[0] != sha256:
            problems.append((subject, f"its file {path} hashes to {actual[0]}: it is damaged"))
    recorded = {sha for sha, _, _ in found.records}
    for sha256 in sorted(found.refs.keys() - recorded):
        problems.append((f"blob {sha256}", f"{found.refs[sha256]} references name it, but it has no record"))
    return problems


def _hash_of(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_READ_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size
