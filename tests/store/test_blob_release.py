"""Retention's release of blob references: a PutBlob or a session made again while a sweep's release is
between its read of the states and its op, a release skipped then, and one cut off by a crash."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ckpt.codec import ChainPolicy, FrameKind
from ckpt.sidecar.config import Retention, StoreConfig
from ckpt.sidecar.store import Store
from ckpt.sidecar.store.blobs import Blobs
from ckpt.sidecar.store.ops import Op
from tests.support import ROOT


def config(data_dir: Path, max_depth: int = 0) -> StoreConfig:
    # max_depth 0: every version a FULL frame, retention keeps exactly the newest one.
    return StoreConfig(
        data_dir=data_dir, chain_policy=ChainPolicy(max_depth=max_depth), retention=Retention(keep_last_versions=1)
    )


def test_a_blob_stored_again_while_retention_read_the_states_stays_for_the_checkpoint_naming_it(
    tmp_path: Path,
) -> None:
    with Store(config(tmp_path)) as store:
        ref = store.put_blob("s", [b"screenshot"])
        store.put("s", b"v1")
        store.put("s", b"v2")
        blobs = store._blobs
        with store.read() as txn:
            plan = blobs._unnamed(txn, b"s")
        assert plan is not None and plan.shas == [bytes.fromhex(ref.sha256)]
        store.put_blob("s", [b"screenshot"])  # acknowledged: the client may name it next
        assert blobs._submit(Op(blobs._release_op(b"s", plan))).wait() == 0
        store.put("s", b"v3 " + ref.uri.encode())
        assert store.blob(ref.sha256).ref_count == 1
        assert store.blob_files.path(ref.sha256).read_bytes() == b"screenshot"


def test_a_session_made_again_while_retention_read_the_states_keeps_its_blobs(tmp_path: Path) -> None:
    with Store(config(tmp_path)) as store:
        ref = store.put_blob("s", [b"bytes"])
        store.put("s", b"v1")
        store.put("s", b"v2")
        blobs = store._blobs
        with store.read() as txn:
            plan = blobs._unnamed(txn, b"s")
        assert plan is not None and plan.shas == [bytes.fromhex(ref.sha256)]
        store.delete_session("s")  # and written again up to the same head, naming the blob
        store.put_blob("s", [b"bytes"])
        store.put("s", b"new v1 " + ref.uri.encode())
        store.put("s", b"new v2 " + ref.uri.encode())
        assert blobs._submit(Op(blobs._release_op(b"s", plan))).wait() == 0
        assert store.blob_refs("s") == [ref.sha256]
        assert store.blob_files.path(ref.sha256).read_bytes() == b"bytes"


# Unlike the states, so that each of the next versions is a delta on it.
BASE = os.urandom(3000)


def test_a_release_skipped_for_a_write_is_made_by_a_later_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store(config(tmp_path, max_depth=4)) as store:
        ref = store.put_blob("s", [b"x" * 1000])
        store.put("s", BASE + b"v1 " + ref.uri.encode())
        for version in range(2, 7):  # v6 starts a chain: v1-v5 go
            store.put("s", BASE + b"v%d names nothing" % version)
        unnamed = Blobs._unnamed

        def a_write_meanwhile(self: Blobs, txn: object, sid: bytes) -> object:
            plan = unnamed(self, txn, sid)  # type: ignore[arg-type]
            monkeypatch.setattr(Blobs, "_unnamed", unnamed)
            written = threading.Thread(target=lambda: store.put("s", BASE + b"v7 names nothing"))
            written.start()
            written.join()
            return plan

        monkeypatch.setattr(Blobs, "_unnamed", a_write_meanwhile)
        assert store.sweep().versions_removed == 5
        assert store.blob_refs("s") == [ref.sha256]  # skipped: v7 might have named it
        versions = store.list_versions("s", page_size=10)[0]
        assert [(v.version, v.frame_kind) for v in versions] == [(7, FrameKind.DELTA), (6, FrameKind.FULL)]
        assert store.sweep().versions_removed == 0  # nothing more to prune: the blob goes all the same
        assert store.blob_refs("s") == []
        assert not store.blob_files.path(ref.sha256).exists()


SWEEP_KILLED_BEFORE_THE_RELEASE = """
import os, signal, sys
from pathlib import Path
from ckpt.codec import ChainPolicy
from ckpt.sidecar.config import Retention, StoreConfig
from ckpt.sidecar.store import Store
from ckpt.sidecar.store.blobs import Blobs

Blobs.release_unnamed = lambda self, sids: os.kill(os.getpid(), signal.SIGKILL)
config = StoreConfig(
    data_dir=Path(sys.argv[1]), chain_policy=ChainPolicy(max_depth=0), retention=Retention(keep_last_versions=1)
)
with Store(config) as store:
    store.sweep()
"""


def test_a_release_cut_off_by_a_crash_after_the_versions_went_is_made_by_the_next_sweep(tmp_path: Path) -> None:
    with Store(config(tmp_path)) as store:
        ref = store.put_blob("s", [b"bytes"])
        store.put("s", b"v1 " + ref.uri.encode())
        store.put("s", b"v2 names nothing")
    killed = subprocess.run(
        [sys.executable, "-c", SWEEP_KILLED_BEFORE_THE_RELEASE, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    with Store(config(tmp_path)) as store:
        assert store.session("s").first_version == 2  # the versions went before the kill
        assert store.blob_refs("s") == [ref.sha256]
        assert store.sweep().versions_removed == 0
        assert store.blob_refs("s") == []
        assert not store.blob_files.path(ref.sha256).exists()
