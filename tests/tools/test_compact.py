"""Compaction (`ckpt compact`, sidecar.tools.compact): data.mdb written again in full pages, offline, safely."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import lmdb
import pytest

from ckpt.sidecar import PutRequest, Store, StoreConfig, WriteMode
from ckpt.sidecar.client import CheckpointClient, NotFoundError, event
from ckpt.sidecar.errors import Unavailable
from ckpt.sidecar.storage.lmdb_rebuild import rebuild
from ckpt.sidecar.tools.backup import backup
from ckpt.sidecar.tools.compact import COPY_DIR_NAME, compact
from ckpt.v1 import checkpoint_pb2 as pb
from tests.support import ROOT, ckpt, start_sidecar

VERSIONS = 3


def state(session: int, version: int) -> bytes:
    """Version ``version`` of session ``session`` as written: a REPLACE, then MERGE patches (~300 B each)."""
    return pb.Checkpoint(step=version, goal=f"s{session} v{version} " + os.urandom(60).hex()).SerializeToString()


def fill_interleaved(data: Path, sessions: int, *, seed: int = 1) -> dict[str, list[bytes]]:
    """Every session's versions written in a random interleaving (as many agents writing at once leave the
    frames table: pages split half full); each session's merged states, by version."""
    rng = random.Random(seed)
    order = [i for i in range(sessions) for _ in range(VERSIONS)]
    rng.shuffle(order)
    written: dict[str, list[bytes]] = {}
    requests = []
    for i in order:
        sid = f"agent-{i:05d}"
        versions = written.setdefault(sid, [])
        patch = state(i, len(versions) + 1)
        versions.append((versions[-1] if versions else b"") + patch)
        requests.append(PutRequest(sid, patch, WriteMode.MERGE if len(versions) > 1 else WriteMode.REPLACE))
    with Store(StoreConfig(data_dir=data)) as store:
        for k in range(0, len(requests), 400):
            for result in store.put_many(requests[k : k + 400]):
                assert not isinstance(result, Exception), result
    return written


def same_message(a: bytes, b: bytes) -> bool:
    # A MERGE state comes back as the concatenation or its canonical form: equal as messages.
    return pb.Checkpoint.FromString(a) == pb.Checkpoint.FromString(b)


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_compaction_writes_an_interleaved_store_in_full_pages_and_a_sidecar_serves_all_of_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    written = fill_interleaved(data, 1500)
    deleted = [sid for n, sid in enumerate(sorted(written)) if n % 3 == 0]
    with Store(StoreConfig(data_dir=data)) as store:
        for sid in deleted:
            store.delete_session(sid)
    kept = {sid: versions for sid, versions in written.items() if sid not in deleted}
    live = start_sidecar(data)
    try:
        with CheckpointClient(live.unix_target) as client:
            client.append_events("agent-00001", [event("tool", b"call %d" % n) for n in range(300)])
            blob = os.urandom(300_000)
            ref = client.put_blob(blob, session_id="agent-00001", media_type="application/octet-stream")
    finally:
        assert live.stop() == 0
    with Store(StoreConfig(data_dir=data), readonly=True) as store:
        backup(store, tmp_path / "plain-copy")  # LMDB's compacted copy: free pages out, pages as they are
    plain_copy = (tmp_path / "plain-copy" / "lmdb" / "data.mdb").stat().st_size

    result = ckpt("compact", "--data-dir", str(data))
    assert result.returncode == 0, result.stderr.decode()
    summary = json.loads(result.stdout)
    assert summary["sessions"] == len(kept) and summary["versions"] == VERSIONS * len(kept)
    after = (data / "lmdb" / "data.mdb").stat().st_size
    assert summary["data_mdb_bytes_after"] == after < summary["data_mdb_bytes_before"]
    # Written again in key order, pages full: well under LMDB's own compacted copy, which keeps half-full pages.
    assert after < 0.8 * plain_copy, (after, plain_copy)
    assert sorted(p.name for p in data.iterdir()) == ["blobs", "ckpt.lock", "lmdb"]  # no copy left behind
    verified = ckpt("verify", "--data-dir", str(data))
    assert verified.returncode == 0, verified.stdout.decode() + verified.stderr.decode()

    live = start_sidecar(data)
    try:
        with CheckpointClient(live.unix_target) as client:
            for sid, versions in kept.items():
                for version, expected in enumerate(versions, start=1):
                    assert same_message(client.get(sid, version=version).state, expected), (sid, version)
            for sid in deleted[:20]:
                with pytest.raises(NotFoundError):
                    client.get(sid)
            assert [e.payload for e in client.events("agent-00001")] == [b"call %d" % n for n in range(300)]
            assert b"".join(client.get_blob(ref)) == blob
            assert client.merge("agent-00001", state(1, 9)).version == VERSIONS + 1
    finally:
        assert live.stop() == 0
    live = start_sidecar(data)  # the write after the compaction, durable across a restart
    try:
        with CheckpointClient(live.unix_target) as client:
            assert client.get("agent-00001").version == VERSIONS + 1
    finally:
        assert live.stop() == 0


def test_compaction_refuses_a_store_open_in_another_process_and_changes_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    fill_interleaved(data, 50)
    data_mdb = data / "lmdb" / "data.mdb"
    before = file_digest(data_mdb)
    with Store(StoreConfig(data_dir=data)):  # a writer: holds the data directory
        result = ckpt("compact", "--data-dir", str(data))
    assert result.returncode == 1
    assert f"data directory {data} is in use by pid {os.getpid()}" in result.stderr.decode()
    with Store(StoreConfig(data_dir=data), readonly=True):  # a reader: holds LMDB's environment open
        result = ckpt("compact", "--data-dir", str(data))
    assert result.returncode == 1
    assert f"the store in {data} is open in another process" in result.stderr.decode()
    assert "nothing was changed" in result.stderr.decode()
    assert file_digest(data_mdb) == before
    assert not (data / COPY_DIR_NAME).exists()
    missing = ckpt("compact", "--data-dir", str(tmp_path / "nothing-here"))
    assert missing.returncode == 1 and "no ckpt store in" in missing.stderr.decode()


def test_a_compaction_killed_at_any_point_leaves_the_store_whole(tmp_path: Path) -> None:
    data = tmp_path / "data"
    written = fill_interleaved(data, 4000)
    with Store(StoreConfig(data_dir=data)) as store:  # ballast, so that the copy takes a while
        store.put_many([PutRequest(f"ballast-{n:03d}", os.urandom(100_000)) for n in range(300)])
    sample = random.Random(2).sample(sorted(written), 200)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # The command starts in ~0.6 s here and compacts in ~0.3: kills before, during and after its work.
    for delay in (0.1, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.2):
        proc = subprocess.Popen(
            [sys.executable, "-m", "ckpt.sidecar.cli", "compact", "--data-dir", str(data)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        with Store(StoreConfig(data_dir=data), readonly=True) as store:
            assert store.stats()["versions"] == VERSIONS * len(written) + 300
            for sid in sample:
                assert same_message(store.get(sid).state, written[sid][-1]), (delay, sid)
    result = ckpt("compact", "--data-dir", str(data))
    assert result.returncode == 0, result.stderr.decode()
    assert sorted(p.name for p in data.iterdir()) == ["ckpt.lock", "lmdb"]  # what killed runs left is gone
    verified = ckpt("verify", "--data-dir", str(data))
    assert verified.returncode == 0, verified.stdout.decode() + verified.stderr.decode()
    with Store(StoreConfig(data_dir=data)) as store:
        for sid in sample:
            assert same_message(store.get(sid).state, written[sid][-1])
        assert store.put(sample[0], state(0, 9), mode=WriteMode.MERGE).version == VERSIONS + 1


def test_compact_in_process_on_a_closed_store(tmp_path: Path) -> None:
    data = tmp_path / "data"
    written = fill_interleaved(data, 300)
    before = file_digest(data / "lmdb" / "data.mdb")
    with Store(StoreConfig(data_dir=data), readonly=True), pytest.raises(Unavailable, match="in this process"):
        compact(data)  # a reader in this process holds no lock byte of its own against this one
    assert file_digest(data / "lmdb" / "data.mdb") == before
    result = compact(data)
    assert (result.sessions, result.versions) == (300, 900)
    assert result.data_mdb_bytes_after < result.data_mdb_bytes_before
    with Store(StoreConfig(data_dir=data)) as store:
        for sid, versions in written.items():
            assert same_message(store.get(sid).state, versions[-1])
            assert same_message(store.get(sid, 1).state, versions[0])


def test_a_rebuilt_environment_holds_every_database_its_flags_and_the_main_tables_plain_keys(tmp_path: Path) -> None:
    source = lmdb.open(str(tmp_path / "source"), max_dbs=4, map_size=1 << 26)
    plain = source.open_db(b"plain")
    dups = source.open_db(b"dups", dupsort=True)
    rng = random.Random(3)
    with source.begin(write=True) as txn:
        txn.put(b"a main key", b"its value")
        for n in rng.sample(range(100_000), 5000):  # in no order
            txn.put(b"%08d" % n, os.urandom(rng.randrange(0, 900)), db=plain)
        for n in range(300):
            for d in rng.sample(range(50), 5):
                txn.put(b"k%03d" % n, b"dup %02d" % d, db=dups)
    (tmp_path / "rebuilt").mkdir()
    with source.begin() as txn:
        counts = rebuild(source, txn, tmp_path / "rebuilt", max_dbs=4)
        expected = {name: list(txn.cursor(db=db)) for name, db in ((b"plain", plain), (b"dups", dups))}
        main = list(txn.cursor())
    assert counts == {b"": 1, b"plain": 5000, b"dups": 1500}
    out = lmdb.open(str(tmp_path / "rebuilt"), max_dbs=4, readonly=True)
    with out.begin() as txn:
        assert out.open_db(b"dups", txn=txn, create=False).flags()["dupsort"]
        for name, items in expected.items():
            assert list(txn.cursor(db=out.open_db(name, txn=txn, create=False))) == items
        assert [(k, v) for k, v in txn.cursor() if k == b"a main key"] == [
            (k, v) for k, v in main if k == b"a main key"
        ]
        leaves = txn.stat(out.open_db(b"plain", txn=txn, create=False))["leaf_pages"]
    with source.begin() as txn:
        assert leaves < 0.8 * txn.stat(plain)["leaf_pages"]  # appended in order: pages full, not split in half
