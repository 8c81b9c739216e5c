"""A PutBlob whose bytes find no room on the disk: refused as other full-disk writes are, nothing kept.

The sidecar's gRPC process (which writes a PutBlob's bytes) gets a file size
limit (RLIMIT_FSIZE, set with prlimit) standing in for a full disk: its file
writes then fail with EFBIG where a full disk gives ENOSPC.
"""

from __future__ import annotations

import errno
import os
import resource
from pathlib import Path

import pytest

from ckpt.sidecar import Store, StoreConfig, StoreFull, Unavailable
from ckpt.sidecar.client import CheckpointClient, ResourceExhaustedError
from tests.server.test_blobs import blob_files, temp_files
from tests.support import metric, start_sidecar_with_metrics, wait_for_metrics

MIB = 1024 * 1024


def test_a_put_blob_on_a_full_disk_is_resource_exhausted_counted_and_keeps_nothing(tmp_path: Path) -> None:
    sc = start_sidecar_with_metrics(tmp_path / "data")
    try:
        with CheckpointClient(sc.unix_target) as client:
            client.put("s", b"state")
            soft, hard = resource.prlimit(sc.process.pid, resource.RLIMIT_FSIZE)
            resource.prlimit(sc.process.pid, resource.RLIMIT_FSIZE, (MIB, hard))  # the gRPC process only
            with pytest.raises(ResourceExhaustedError) as refused:
                client.put_blob(os.urandom(2 * MIB), session_id="s", chunk_size_bytes=256 * 1024)
            text = str(refused.value)
            assert f"no space to write blob bytes under {sc.data_dir / 'blobs'}" in text, text
            assert f"(the disk is full: {os.strerror(errno.EFBIG)})" in text
            assert "could not write the blob's temporary file" in text and "nothing was stored" in text
            assert blob_files(sc.data_dir) == [] and temp_files(sc.data_dir) == []
            wait_for_metrics(lambda: metric(sc, "ckpt_store_full_writes_total") == 1)
            assert client.get("s").state == b"state"  # serving on

            resource.prlimit(sc.process.pid, resource.RLIMIT_FSIZE, (soft, hard))  # room again
            ref = client.put_blob(os.urandom(2 * MIB), session_id="s")
            assert ref.size_bytes == 2 * MIB
        assert len(blob_files(sc.data_dir)) == 1
    finally:
        assert sc.stop() == 0, sc.log()


def _failing_writes(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    def write(fd: int, data: object) -> int:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr("ckpt.sidecar.store.blobfiles.os.write", write)


def test_a_blob_write_failing_with_no_space_is_store_full_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        _failing_writes(monkeypatch, errno.ENOSPC)
        with pytest.raises(StoreFull, match=r"\(the disk is full: No space left on device\): could not write"):
            store.put_blob("s", [b"x" * 1000])
        assert store.counters.store_full_refusals == 1
        assert temp_files(tmp_path / "data") == []
        monkeypatch.undo()
        assert store.put_blob("s", [b"x" * 1000]).size_bytes == 1000


def test_a_blob_write_failing_otherwise_is_unavailable_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        _failing_writes(monkeypatch, errno.EIO)
        with pytest.raises(
            Unavailable, match=r"could not write the blob's temporary file .*\.part .*Input/output error"
        ):
            store.put_blob("s", [b"x" * 1000])
        assert store.counters.store_full_refusals == 0
        assert temp_files(tmp_path / "data") == []
