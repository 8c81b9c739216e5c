"""A full disk, as a user meets it: a real sidecar whose data file cannot grow.

The sidecar's file size limit (RLIMIT_FSIZE, set on the running process with
prlimit) stands in for a full filesystem: LMDB's page writes then fail with
EFBIG where a full disk gives ENOSPC, through the same commit path.
"""

from __future__ import annotations

import errno
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest

from ckpt.bench.output import process_and_children
from ckpt.sidecar import Store, StoreConfig, StoreFull
from ckpt.sidecar.client import CheckpointClient, NotFoundError, ResourceExhaustedError
from ckpt.sidecar.storage import LmdbStorage
from tests.store.support import state_of
from tests.store.test_commit_failure import _FailingCommits as FailingCommits  # storage whose next commits fail
from tests.support import ROOT, start_sidecar

STATE_BYTES = 64 * 1024


def test_a_full_disk_is_resource_exhausted_and_loses_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    sidecar = start_sidecar(data_dir)
    kept: dict[str, bytes] = {}
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            for i in range(4):  # acknowledged before the disk fills
                kept[f"kept-{i}"] = os.urandom(STATE_BYTES)  # random: stored at full size
                client.put(f"kept-{i}", kept[f"kept-{i}"])
            limit = os.path.getsize(data_dir / "lmdb" / "data.mdb") + 2 * 1024 * 1024
            for pid in process_and_children(sidecar.process.pid):  # the store process writes
                resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, limit))

            filled: list[str] = []
            refused: ResourceExhaustedError | None = None
            for i in range(200):  # 2 MiB of room: about 30 writes fit
                session, state = f"fill-{i}", os.urandom(STATE_BYTES)
                try:
                    client.put(session, state, request_id=f"fill-{i}")
                except ResourceExhaustedError as exc:
                    refused = exc
                    break
                kept[session] = state
                filled.append(session)
            assert refused is not None, "200 writes of 64 KiB fit under a 2 MiB file size limit"
            assert f"no space to write under {data_dir}" in str(refused), refused
            assert "file size limit (RLIMIT_FSIZE" in str(refused)
            assert "nothing was written" in str(refused)
            assert filled, "no write fit before the disk was full"

            # The refused write left nothing behind; every acknowledged one reads back.
            with pytest.raises(NotFoundError, match="does not exist"):
                client.get(f"fill-{len(filled)}")
            for session, state in kept.items():
                assert client.get(session).state == state

            # Deleting frees pages inside the file: the refused write now fits, under its own request id.
            for session in filled[: len(filled) // 2]:
                client.delete(session)
                del kept[session]
            retried = os.urandom(STATE_BYTES)
            response = client.put(f"fill-{len(filled)}", retried, request_id=f"fill-{len(filled)}")
            assert response.version == 1
            kept[f"fill-{len(filled)}"] = retried
        assert sidecar.stop() == 0
    finally:
        sidecar.stop()

    # Reopened without the limit: everything acknowledged is there, and every frame checks.
    verify = subprocess.run(
        [sys.executable, "-m", "ckpt.sidecar.cli", "verify", "--data-dir", str(data_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    sidecar = start_sidecar(data_dir)
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            for session, state in kept.items():
                assert client.get(session).state == state
    finally:
        sidecar.stop()


def _storage(tmp_path: Path) -> LmdbStorage:
    return LmdbStorage(
        tmp_path, readonly=False, map_size_bytes=1 << 20, max_map_size_bytes=1 << 20, max_readers=8, meta_sync=True
    )


def _commit_error(cls: type[lmdb.Error], code: int) -> lmdb.Error:
    """The exception py-lmdb raises for a commit failing with the system error ``code`` (class and text)."""
    return cls("mdb_txn_commit: " + os.strerror(code))


# py-lmdb's class for each system error: DiskError for ENOSPC, ReadonlyError for EACCES, MemoryError for ENOMEM,
# a plain Error for the errors it has no class for.
@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (_commit_error(lmdb.DiskError, errno.ENOSPC), "the disk is full: " + os.strerror(errno.ENOSPC)),
        (_commit_error(lmdb.Error, errno.ENOSPC), "the disk is full: " + os.strerror(errno.ENOSPC)),
        (_commit_error(lmdb.Error, errno.EDQUOT), "the disk is full: " + os.strerror(errno.EDQUOT)),
        (_commit_error(lmdb.Error, errno.EFBIG), "the disk is full: " + os.strerror(errno.EFBIG)),
        (_commit_error(lmdb.Error, errno.EIO), None),  # plenty of free space: a real I/O error
        (_commit_error(lmdb.ReadonlyError, errno.EACCES), None),
        (_commit_error(lmdb.MemoryError, errno.ENOMEM), None),
        (lmdb.CorruptedError("mdb_txn_commit: MDB_CORRUPTED: Located page was wrong type"), None),
    ],
)
def test_which_commit_failures_are_a_full_disk(tmp_path: Path, error: lmdb.Error, reason: str | None) -> None:
    storage = _storage(tmp_path)
    free = shutil.disk_usage(tmp_path).free
    assert free > 64 * 1024 * 1024, "this test needs a disk with room to spare"
    try:
        assert storage.why_full(error, 4096) == reason
    finally:
        storage.close()


def test_a_commit_failing_with_no_space_is_refused_and_writes_go_on_once_there_is_room(tmp_path: Path) -> None:
    """py-lmdb raises lmdb.DiskError for ENOSPC: the write is refused as a full store, the store keeps writing."""
    config = StoreConfig(data_dir=tmp_path / "data", sweep_interval_seconds=3600)
    stopped: list[str] = []
    with Store(config, on_writes_stopped=stopped.append) as store:
        store.put("s", state_of("s", 1))
        # Two: the write's, and the one that would let it reuse the pages the last commit freed.
        failing = FailingCommits(store, failures=2, error=_commit_error(lmdb.DiskError, errno.ENOSPC))
        with pytest.raises(StoreFull, match=r"no space to write under .*\(the disk is full: No space left on device\)"):
            store.put("t", state_of("t", 1))
        assert failing.failures == 0
        assert store.counters.store_full_refusals == 1
        assert store.writes_stopped is None and stopped == []
        assert store.get("s").state == state_of("s", 1)  # reads go on
        # The disk has room again: the refused write, and others, are written.
        assert store.put("t", state_of("t", 1)).version == 1
        assert store.put("s", state_of("s", 2)).version == 2
    with Store(config) as store:
        assert store.get("t").state == state_of("t", 1)
        assert store.get("s").version == 2


def test_an_io_error_on_a_nearly_full_disk_is_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LMDB reports a page write cut short by a full disk as EIO; the free space tells them apart."""
    storage = _storage(tmp_path)
    real = os.statvfs(tmp_path)
    nearly_full = os.statvfs_result((real.f_bsize, 4096, real.f_blocks, 3, 3, *real[5:]))
    monkeypatch.setattr(os, "statvfs", lambda path: nearly_full)
    eio = lmdb.Error("mdb_txn_commit: " + os.strerror(errno.EIO))
    try:
        assert storage.why_full(eio, 4096) == "the disk is full: 12288 bytes free"
        assert storage.why_full(lmdb.MapFullError("mdb_put: MDB_MAP_FULL"), 4096) is None
    finally:
        storage.close()
