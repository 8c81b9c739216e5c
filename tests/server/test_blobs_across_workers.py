"""PutBlob under `ckpt serve --workers 2`: a blob refused on a worker other than the sweeping one leaves no file.

Each worker streams a blob into a temporary file and has its own store process
move the file into place inside the transaction that records it; only worker
0's store process sweeps. A record whose transaction fails after the move (a
full store) must not leave the file behind until a restart: the tests send
their blobs through connections the second worker serves.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import BinaryIO, cast

import pytest

from ckpt.sidecar.client import CheckpointClient, InvalidArgumentError, ResourceExhaustedError
from tests.server.test_blobs import FailingFile, blob_files, temp_files
from tests.server.test_workers import serving_workers

MIB = 1024 * 1024
#: No sweep while a test runs: what it sees removed, a sweep did not remove.
NO_SWEEP = ("--sweep-interval-seconds", "3600")


def _fill(client: CheckpointClient) -> int:
    """Put states through ``client`` until the store is full; how many sessions that took."""
    n = 0
    for size in (64 * 1024, 4096, 256):
        try:
            while True:
                client.put(f"fill-{n}", os.urandom(size))
                n += 1
        except ResourceExhaustedError:
            pass
    return n


def test_a_blob_the_full_store_refuses_on_the_second_worker_leaves_no_file_and_stored_ones_stay(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    with serving_workers(data_dir, "--max-map-size-bytes", str(MIB), *NO_SWEEP) as by_worker:
        first, second = by_worker[0][0], by_worker[1][0]
        second.put("s", b"state")
        # Refused before anything is moved in: a hash other than the one expected, a stream cut half-way.
        with pytest.raises(InvalidArgumentError):
            second.put_blob(os.urandom(1000), session_id="s", expected_sha256="0" * 64)
        with pytest.raises(OSError):
            second.put_blob(cast(BinaryIO, FailingFile()), session_id="s")
        assert blob_files(data_dir) == []
        filled = _fill(first)
        stored: dict[str, bytes] = {}
        refused = b""
        while not refused:  # blob records until one finds no room: its file was moved in first
            blob = os.urandom(1000)
            try:
                ref = second.put_blob(blob, session_id="s")
            except ResourceExhaustedError as exc:
                assert "the store is full" in str(exc), exc
                refused = blob
            else:
                stored[ref.uri.rsplit(":", 1)[1]] = blob
        assert stored, "the store was full before any blob"
        # At once, without a sweep: the refused blob's file is gone, every stored one's is there.
        assert sorted(p.name for p in blob_files(data_dir)) == sorted(stored)
        assert temp_files(data_dir) == []
        for sha256, blob in stored.items():
            assert b"".join(first.get_blob(f"ckpt-blob:sha256:{sha256}")) == blob
        for n in range(filled):
            first.delete(f"fill-{n}")
        ref = second.put_blob(refused, session_id="s")  # room again: stored, and read back whole
        assert ref.uri == f"ckpt-blob:sha256:{hashlib.sha256(refused).hexdigest()}"
        assert b"".join(first.get_blob(ref)) == refused
        assert len(blob_files(data_dir)) == len(stored) + 1


def test_the_sweeping_worker_removes_files_without_a_record_once_the_blobs_directory_is_marked(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    with serving_workers(data_dir, "--sweep-interval-seconds", "0.2") as by_worker:
        client = by_worker[1][0]
        kept = client.put_blob(b"kept", session_id="s")
        time.sleep(1)  # past the first sweep (due 0.2 s after the start), which looks at every file
        # What a crash, or a removal that failed in another worker's store process, leaves: a blob file
        # with no record, and (the removal failed) the mark that any store process leaves for the sweep.
        orphan = hashlib.sha256(b"orphan").hexdigest()
        path = data_dir / "blobs" / "sha256" / orphan[:2] / orphan
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"orphan")
        time.sleep(1)  # the sweeps after the first, without a mark, leave it
        assert path.exists()
        (data_dir / "blobs" / "unchecked").touch()
        deadline = time.monotonic() + 30
        while path.exists():
            assert time.monotonic() < deadline, "the sweeps left a file without a record"
            time.sleep(0.05)
        assert not (data_dir / "blobs" / "unchecked").exists()
        assert b"".join(client.get_blob(kept)) == b"kept"
        assert [p.name for p in blob_files(data_dir)] == [kept.uri.rsplit(":", 1)[1]]
