"""`ckpt verify` and `ckpt backup` on a data directory holding blobs."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ckpt.codec import ChainPolicy
from ckpt.sidecar.config import StoreConfig
from ckpt.sidecar.store import Store
from ckpt.sidecar.tools.backup import backup
from tests.support import ckpt


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
