"""Damage whose checksums all stay valid: `ckpt verify` names it and a read refuses it.

A session record whose chain start is wrong fails every read and write of
the session, so verify must not say "ok"; a sound FULL frame stored under
another version's key must never be served as that version.
"""

from __future__ import annotations

import random
from pathlib import Path

import lmdb
import pytest

from ckpt.sidecar import DataLoss, Store, StoreConfig, WriteMode
from ckpt.sidecar.store import keys
from ckpt.store.v1 import records_pb2
from tests.support import ckpt


def _write(data_dir: Path, table: bytes, key: bytes, value: bytes) -> None:
    env = lmdb.open(str(data_dir / "lmdb"), max_dbs=8)
    try:
        with env.begin(write=True, db=env.open_db(table)) as txn:
            txn.put(key, value)
    finally:
        env.close()


def test_verify_names_a_session_record_whose_chain_start_is_wrong(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Store(StoreConfig(data_dir=data, fold_on_close_seconds=0)) as store:  # its PATCH head stays
        store.put("agent", random.Random(1).randbytes(20_000))
        for _ in range(5):
            store.put("agent", b"\x0a\x04abcd", mode=WriteMode.MERGE)
        assert store.list_versions("agent")[0][0].frame_kind.name == "PATCH"  # newest first
        expected = store.get("agent").state
    env = lmdb.open(str(data / "lmdb"), max_dbs=8)
    try:
        with env.begin(write=True, db=env.open_db(b"sessions")) as txn:
            raw = txn.get(b"agent")
            assert raw is not None
            record = records_pb2.SessionRecord.FromString(raw)
            assert record.chain_start_version == 1
            record.chain_start_version = record.head_version  # a PATCH frame: its chain starts at 1
            txn.put(b"agent", record.SerializeToString())
    finally:
        env.close()
    done = ckpt("verify", "--data-dir", str(data))
    assert done.returncode == 1, done
    assert (
        b"the session record says the head's chain starts at version 6, but its last FULL frame is version 1"
        in done.stdout + done.stderr
    )
    with Store(StoreConfig(data_dir=data, fold_on_close_seconds=0)) as store:
        # A read needs only the frames, which are whole: it decodes from the real chain start. So does a
        # write: its encoder resumes on the frames the head is read through, never on the record's word.
        assert store.get("agent").state == expected
        assert store.put("agent", b"\x0a\x04efgh", mode=WriteMode.MERGE).version == 7
        assert store.get("agent", use_cache=False).state == expected + b"\x0a\x04efgh"
    done = ckpt("verify", "--data-dir", str(data))
    assert done.returncode == 1 and b"the session record says the head's chain starts at version 6" in done.stderr


def test_a_sound_frame_under_another_versions_key_is_data_loss_not_that_version(tmp_path: Path) -> None:
    data = tmp_path / "data"
    rng = random.Random(3)
    states = [rng.randbytes(5_000) for _ in range(3)]  # incompressible: every version a FULL frame
    with Store(StoreConfig(data_dir=data)) as store:
        for state in states:
            store.put("agent", state)
    sid = keys.session_key("agent")
    env = lmdb.open(str(data / "lmdb"), max_dbs=8)
    try:
        with env.begin(db=env.open_db(b"frames")) as txn:
            value = txn.get(keys.frame_key(sid, 1))
            assert value is not None
            first = bytes(value)
    finally:
        env.close()
    _write(data, b"frames", keys.frame_key(sid, 3), first)  # version 3's key holds version 1's frame
    with Store(StoreConfig(data_dir=data)) as store:
        with pytest.raises(DataLoss, match="session 'agent' version 3: the frame stored there is version 1's"):
            store.get("agent")
        assert store.get("agent", 2).state == states[1]  # the others still read
    done = ckpt("verify", "--data-dir", str(data))
    assert done.returncode == 1, done
    assert b"version 3: the frame stored there is version 1's" in done.stdout + done.stderr
