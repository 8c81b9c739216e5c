"""`ckpt verify` and `ckpt backup` on a data directory holding blobs."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import ckpt.sidecar.tools.backup as backup_module
from ckpt.codec import ChainPolicy
from ckpt.sidecar.client import CheckpointClient
from ckpt.sidecar.config import StoreConfig
from ckpt.sidecar.errors import DataLoss
from ckpt.sidecar.store import Store
from ckpt.sidecar.tools.backup import backup
from tests.support import ROOT, ckpt, start_sidecar


def _store_with_blobs(data_dir: Path) -> tuple[str, str]:
    with Store(StoreConfig(data_dir=data_dir, chain_policy=ChainPolicy())) as store:
        a = store.put_blob("s", [os.urandom(300_000)], media_type="image/png")
        b = store.put_blob("t", [b"a log line\n" * 1000])
        store.put("s", a.uri.encode())
    return a.sha256, b.sha256


def test_verify_names_a_blob_whose_file_is_damaged_missing_or_cut(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    a, b = _store_with_blobs(data_dir)
    ok = ckpt("verify", "--data-dir", str(data_dir))
    assert ok.returncode == 0, ok.stderr
    assert b"2 blobs checked" in ok.stdout
    path = data_dir / "blobs" / "sha256" / a[:2] / a
    raw = bytearray(path.read_bytes())
    raw[1000] ^= 0x01  # one bit flipped
    path.write_bytes(bytes(raw))
    flipped = ckpt("verify", "--data-dir", str(data_dir))
    assert flipped.returncode == 1
    assert f"FAIL blob {a}: its file {path} hashes to".encode() in flipped.stderr
    path.write_bytes(bytes(raw[:-7]))  # truncated
    cut = ckpt("verify", "--data-dir", str(data_dir))
    assert cut.returncode == 1 and f"FAIL blob {a}: its file {path} is 299993 bytes".encode() in cut.stderr
    (data_dir / "blobs" / "sha256" / b[:2] / b).unlink()
    gone = ckpt("verify", "--data-dir", str(data_dir))
    assert gone.returncode == 1 and f"FAIL blob {b}: its file".encode() in gone.stderr and b"is missing" in gone.stderr


def test_a_backup_carries_the_blobs_and_serves_them(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    a, b = _store_with_blobs(data_dir)
    result = ckpt("backup", str(tmp_path / "copy"), "--data-dir", str(data_dir))
    assert result.returncode == 0, result.stderr
    with Store(StoreConfig(data_dir=data_dir), readonly=True) as original:
        originals = {sha: original.blob_files.path(sha).read_bytes() for sha in (a, b)}
    with Store(StoreConfig(data_dir=tmp_path / "copy")) as copy:
        for sha, data in originals.items():
            assert copy.blob(sha).size_bytes == len(data)
            assert copy.blob_files.path(sha).read_bytes() == data
            assert hashlib.sha256(data).hexdigest() == sha
    assert ckpt("verify", "--data-dir", str(tmp_path / "copy")).returncode == 0
    with Store(StoreConfig(data_dir=data_dir)) as store:  # the library call too
        backup(store, tmp_path / "copy2")
    assert sorted(p.name for p in (tmp_path / "copy2" / "blobs").rglob("*") if p.is_file()) == sorted([a, b])


def _until(done: Callable[[], bool], what: str, *, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.005)


def _writer_once_read(fifo: Path, reader: subprocess.Popen[bytes]) -> int:
    """A write end of ``fifo``, opened once ``reader`` has opened it to read: that process is paused there."""
    fd = -1

    def opened() -> bool:
        nonlocal fd
        assert reader.poll() is None, reader.communicate()
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO until a reader has it open
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            return False
        return True

    _until(opened, f"{fifo.name} is opened to be read")
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def _release(fd: int, data: bytes) -> None:
    with os.fdopen(fd, "wb") as pipe:
        pipe.write(data)


def test_verify_beside_a_sidecar_passes_a_blob_deleted_and_stored_anew_while_it_hashes(tmp_path: Path) -> None:
    """verify reads the blobs' records in one snapshot and hashes their files after it: a blob whose last
    session is deleted meanwhile has no file, and one stored again has a new record. Neither is damage. A
    blob file missing under a record that stands still fails."""
    data_dir = tmp_path / "data"
    sidecar = start_sidecar(data_dir)
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            blobs: dict[str, tuple[str, bytes]] = {}
            for n in range(3):
                data = os.urandom(50_000)
                ref = client.put_blob(data, session_id=f"s{n}")
                blobs[ref.content_hash.removeprefix("sha256:")] = (f"s{n}", data)
            first, middle, last = sorted(blobs)  # the order verify hashes the files in
            path = {sha: data_dir / "blobs" / "sha256" / sha[:2] / sha for sha in blobs}
            # The first and last blob files become pipes: verify's read of each waits until the test writes the bytes.
            for sha in (first, last):
                path[sha].unlink()
                os.mkfifo(path[sha])
            verify = subprocess.Popen(
                [sys.executable, "-m", "ckpt.sidecar.cli", "verify", "--data-dir", str(data_dir)],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            try:
                paused = _writer_once_read(path[first], verify)  # the records are read: hashing has begun
                assert client.delete(blobs[middle][0]) == 0  # the middle blob's only session: its file goes
                _until(lambda: not path[middle].exists(), "the deleted blob's file is removed")
                _release(paused, blobs[first][1])
                paused = _writer_once_read(path[last], verify)  # the middle file was found missing
                client.put_blob(blobs[middle][1], session_id="again")  # a new record, a new file
                _release(paused, blobs[last][1])
                out, err = verify.communicate(timeout=60)
            finally:
                verify.kill()
                verify.wait()
            assert verify.returncode == 0, err
            assert b"FAIL" not in err
            assert b"3 blobs checked" in out
            for sha in (first, last):  # files again, then one missing under a record that stands
                path[sha].unlink()
                path[sha].write_bytes(blobs[sha][1])
            path[middle].unlink()
            damaged = ckpt("verify", "--data-dir", str(data_dir))
            assert damaged.returncode == 1
            assert f"FAIL blob {middle}: its file {path[middle]} is missing".encode() in damaged.stderr
    finally:
        assert sidecar.stop() == 0, sidecar.log()


def test_backup_of_a_store_missing_a_recorded_blob_file_fails_naming_the_blob(tmp_path: Path) -> None:
    """A blob file missing while its record stands is damage, as a damaged page is: the backup fails and
    leaves nothing behind, rather than taking it for a blob released after the snapshot."""
    data_dir = tmp_path / "data"
    _, b = _store_with_blobs(data_dir)
    path = data_dir / "blobs" / "sha256" / b[:2] / b
    path.unlink()
    failed = ckpt("backup", str(tmp_path / "copy"), "--data-dir", str(data_dir))
    assert failed.returncode == 1, failed.stdout
    assert f"the store is damaged: blob {b}: its file {path} is missing".encode() in failed.stderr
    assert b"no backup was written" in failed.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]  # no DEST, no partial copy
    with (
        Store(StoreConfig(data_dir=data_dir)) as store,  # the library call too
        pytest.raises(DataLoss, match=f"blob {b}: its file .* is missing, though its record stands"),
    ):
        backup(store, tmp_path / "copy2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


def test_a_blob_released_while_a_backup_runs_is_copied_and_removed_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blob whose last session is deleted between the backup's snapshot and its copy was removed at once:
    the backup, exit 0, recorded it without its bytes (`ckpt verify` of the backup failed, and reading it
    from the backup was DataLoss). Its file now stays until the backup is done, and goes at the next sweep."""
    data_dir = tmp_path / "data"
    a, b = _store_with_blobs(data_dir)
    copies: list[str] = []
    with Store(StoreConfig(data_dir=data_dir)) as store:
        copy_file = backup_module._copy_file

        def delete_then_copy(source: Path, dest: Path) -> None:
            if not copies:  # after the snapshot, before the first copy: the session holding blob b goes
                store.delete_session("t")
                assert store.blob_files.path(b).exists()  # held back while the backup runs
            copies.append(Path(source).name)
            copy_file(source, dest)

        monkeypatch.setattr(backup_module, "_copy_file", delete_then_copy)
        backup(store, tmp_path / "copy")
        assert store.blob_files.path(b).exists()
        store.sweep()
        assert not store.blob_files.path(b).exists() and store.blob_files.path(a).exists()
    assert sorted(copies) == sorted([a, b])
    assert sorted(p.name for p in (tmp_path / "copy" / "blobs" / "sha256").rglob("*") if p.is_file()) == sorted([a, b])
    checked = ckpt("verify", "--data-dir", str(tmp_path / "copy"))
    assert checked.returncode == 0, checked.stderr
    assert (tmp_path / "copy" / "blobs" / "sha256" / b[:2] / b).read_bytes() == b"a log line\n" * 1000


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda raw: raw[:500] + bytes([raw[500] ^ 0x01]) + raw[501:], id="a-bit-flipped"),
        pytest.param(lambda raw: raw[:-7], id="cut"),
        pytest.param(lambda raw: None, id="missing"),
    ],
)
def test_storing_the_same_bytes_again_mends_a_file_verify_names(
    tmp_path: Path, damage: Callable[[bytes], bytes | None]
) -> None:
    data_dir = tmp_path / "data"
    data = os.urandom(300_000)
    sidecar = start_sidecar(data_dir)
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            ref = client.put_blob(data, session_id="s")
            sha256 = ref.content_hash.removeprefix("sha256:")
            path = data_dir / "blobs" / "sha256" / sha256[:2] / sha256
            damaged = damage(path.read_bytes())
            if damaged is None:
                path.unlink()
            else:
                path.write_bytes(damaged)
            assert ckpt("verify", "--data-dir", str(data_dir)).returncode == 1
            # The bytes sent again replace the damaged file (they were dropped, the file in place kept as it was).
            again = client.put_blob(data, session_id="t")
            assert again.content_hash == ref.content_hash
            assert b"".join(client.get_blob(ref.uri)) == data
    finally:
        assert sidecar.stop() == 0
    assert path.read_bytes() == data
    ok = ckpt("verify", "--data-dir", str(data_dir))
    assert ok.returncode == 0, ok.stderr


def test_storing_the_same_bytes_again_leaves_a_sound_file_in_place(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data = b"a log line\n" * 1000
    with Store(StoreConfig(data_dir=data_dir)) as store:
        first = store.put_blob("s", [data])
        path = data_dir / "blobs" / "sha256" / first.sha256[:2] / first.sha256
        inode = path.stat().st_ino
        store.put_blob("t", [data])
        assert path.stat().st_ino == inode
        assert store.blob(first.sha256).ref_count == 2
