"""A store's files are private to the user running it: the directories ckpt makes for a store (or a backup)
are 0700 and the files it writes there 0600, whatever the usual umask (022) would give; directories that
already exist keep their mode, files an older build wrote keep theirs, and files the command line writes
for the user (``--out FILE``) keep the umask's mode."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckpt.sidecar import Store, StoreConfig
from ckpt.sidecar.client import CheckpointClient
from ckpt.sidecar.server import wait_until_serving
from tests.support import ROOT, ckpt, start_sidecar


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    """The umask most systems give a user (022: new files 0644, new directories 0755), for this test and
    the processes it starts."""
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def modes_within(root: Path) -> dict[str, int]:
    """Every directory and regular file under ``root`` (not ``root``), by path relative to it: its mode."""
    return {
        str(path.relative_to(root)): mode(path)
        for path in root.rglob("*")
        if stat.S_ISDIR(path.lstat().st_mode) or stat.S_ISREG(path.lstat().st_mode)
    }


def assert_private_within(root: Path, *expected: str) -> None:
    """Every directory under ``root`` is 0700 and every file 0600; ``expected`` paths are among them."""
    found = modes_within(root)
    assert set(expected) <= set(found), sorted(found)
    wrong = {name: oct(m) for name, m in found.items() if m != (0o700 if (root / name).is_dir() else 0o600)}
    assert not wrong, wrong


def blob_file(sha256: str) -> str:
    return f"blobs/sha256/{sha256[:2]}/{sha256}"


STORE_FILES = ("lmdb", "lmdb/data.mdb", "lmdb/lock.mdb", "ckpt.lock", "blobs", "blobs/tmp")


def test_a_sidecar_on_a_new_data_dir_makes_it_and_its_files_private(tmp_path: Path) -> None:
    data = tmp_path / "new" / "data"  # its parent does not exist either
    sidecar = start_sidecar(data, socket_path=data / "ckpt.sock")
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            client.put("s", b"a conversation")
            sha256 = client.put_blob(b"a tool's output", session_id="s").content_hash.removeprefix("sha256:")
        assert mode(tmp_path / "new") == 0o700 and mode(data) == 0o700
        assert_private_within(data, *STORE_FILES, blob_file(sha256))
        # gRPC makes the socket under the umask: 0755, which only its owner may connect to (connect() needs
        # write permission on the socket), and the private data directory hides it from everyone else anyway.
        assert mode(data / "ckpt.sock") & (stat.S_IWGRP | stat.S_IWOTH) == 0
    finally:
        assert sidecar.stop() == 0


def test_ckpt_serve_on_a_data_dir_that_does_not_exist_makes_it_private(tmp_path: Path) -> None:
    data = tmp_path / "new" / "data"  # made by `ckpt serve` itself, not by a launcher
    socket_path = tmp_path / "ckpt.sock"
    cmd = [
        sys.executable,
        "-m",
        "ckpt.sidecar.cli",
        "serve",
        "--data-dir",
        str(data),
        "--listen",
        f"unix:{socket_path}",
    ]
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as serve:
        try:
            wait_until_serving(f"unix:{socket_path}", timeout_seconds=30)
            assert mode(tmp_path / "new") == 0o700 and mode(data) == 0o700
            assert_private_within(data, *STORE_FILES[:4])
        finally:
            serve.send_signal(signal.SIGTERM)
            assert serve.wait(30) == 0, serve.stderr.read() if serve.stderr else b""


def test_an_embedded_store_on_a_new_data_dir_makes_it_and_its_files_private(tmp_path: Path) -> None:
    data = tmp_path / "new" / "data"
    with Store(StoreConfig(data_dir=data)) as store:
        store.put("s", b"a conversation")
        sha256 = store.put_blob("s", [b"a tool's output"]).sha256
        assert mode(tmp_path / "new") == 0o700 and mode(data) == 0o700
        assert_private_within(data, *STORE_FILES, blob_file(sha256))


def test_an_existing_data_dir_keeps_its_mode_and_the_files_made_in_it_are_private(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o755)
    sidecar = start_sidecar(data)
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            sha256 = client.put_blob(b"a tool's output", session_id="s").content_hash.removeprefix("sha256:")
        assert mode(data) == 0o755
        assert_private_within(data, *STORE_FILES, blob_file(sha256))
    finally:
        assert sidecar.stop() == 0


def test_ckpt_backup_writes_a_private_copy(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Store(StoreConfig(data_dir=data)) as store:
        store.put("s", b"a conversation")
        sha256 = store.put_blob("s", [b"a tool's output"]).sha256
    dest = tmp_path / "backup"
    done = ckpt("backup", "--data-dir", str(data), str(dest))
    assert done.returncode == 0, done.stderr
    assert mode(tmp_path) == 0o700 and mode(dest) == 0o700  # its parent existed: left as it was
    assert_private_within(dest, "lmdb", "lmdb/data.mdb", blob_file(sha256))
    verified = ckpt("verify", "--data-dir", str(dest))  # opening it makes the backup's lock.mdb
    assert verified.returncode == 0, verified.stderr
    assert_private_within(dest, "lmdb/lock.mdb")


def test_a_store_an_older_build_made_readable_keeps_its_modes_and_works(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Store(StoreConfig(data_dir=data)) as store:
        store.put("s", b"v1")
        old_blob = store.put_blob("s", [b"old output"]).sha256
    for path in [data, *data.rglob("*")]:  # what an older build left under umask 022
        path.chmod(0o755 if path.is_dir() else 0o644)
    with Store(StoreConfig(data_dir=data)) as store:
        store.put("s", b"v2")
        new_blob = store.put_blob("s", [b"new output"]).sha256
        assert store.get("s").state == b"v2"
    found = modes_within(data)
    old = ("lmdb", "lmdb/data.mdb", "lmdb/lock.mdb", "ckpt.lock", "blobs/sha256", blob_file(old_blob))
    assert {name: oct(found[name]) for name in old} == {
        name: oct(0o755 if (data / name).is_dir() else 0o644) for name in old
    }
    assert mode(data) == 0o755 and found[blob_file(new_blob)] == 0o600
    assert found[str(Path(blob_file(new_blob)).parent)] == 0o700 or new_blob[:2] == old_blob[:2]


def test_files_the_command_line_writes_for_the_user_keep_the_umask_mode(tmp_path: Path) -> None:
    data = tmp_path / "data"
    sidecar = start_sidecar(data)
    try:
        t = ("--target", sidecar.unix_target)
        with CheckpointClient(sidecar.unix_target) as client:
            client.put("s", b"a conversation")
            uri = client.put_blob(b"a tool's output", session_id="s").uri
        state, artifact = tmp_path / "state.bin", tmp_path / "artifact.bin"
        assert ckpt("get", "s", "--out", str(state), *t).returncode == 0
        assert ckpt("blob", "get", uri, "--out", str(artifact), *t).returncode == 0
        assert (state.read_bytes(), artifact.read_bytes()) == (b"a conversation", b"a tool's output")
        assert (mode(state), mode(artifact)) == (0o644, 0o644)
    finally:
        assert sidecar.stop() == 0
