"""Message types on the command line: `ckpt register-type`, `ckpt put --type`, and what inspect, verify and
backup make of a store holding typed sessions."""

from __future__ import annotations

import json
from pathlib import Path

import lmdb
import pytest

from ckpt.sidecar import DataLoss, Store, StoreConfig
from tests.support import AGENT_STATE, Sidecar, agent_file, agent_state_class, agent_step, ckpt, descriptor_set_of


def test_register_a_descriptor_set_file_then_put_typed_states(sidecar: Sidecar, tmp_path: Path) -> None:
    t = ("--target", sidecar.unix_target)
    state_class = agent_state_class()
    types = tmp_path / "state.binpb"  # as `protoc --include_imports --descriptor_set_out` writes it
    types.write_bytes(descriptor_set_of(agent_file()))
    patch = agent_step(state_class, 1).SerializeToString()
    refused = ckpt("put", "typed", "--merge", "--type", AGENT_STATE, *t, stdin=patch)
    assert refused.returncode == 1
    assert b"message_type 'acme.agent.v1.State' is not registered: call RegisterType" in refused.stderr
    done = ckpt("register-type", str(types), *t)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "message_types": ["acme.agent.v1.Entity", "acme.agent.v1.Entity.Note", AGENT_STATE]
    }
    done = ckpt("put", "typed", "--merge", "--type", AGENT_STATE, *t, stdin=patch)
    assert done.returncode == 0, done.stderr
    bad = ckpt("put", "typed", "--merge", *t, stdin=b"\x12\x01\xff")  # the session's type, unnamed: checked
    assert bad.returncode == 1 and b"field 2 (log) at offset 0" in bad.stderr
    assert state_class.FromString(ckpt("get", "typed", *t).stdout) == agent_step(state_class, 1)
    listed = json.loads(ckpt("sessions", *t).stdout)
    assert listed["message_type"] == AGENT_STATE
    malformed = tmp_path / "not-a-set"
    malformed.write_bytes(b"\xff\xff")
    done = ckpt("register-type", str(malformed), *t)
    assert done.returncode == 1
    assert b"does not parse as a google.protobuf.FileDescriptorSet" in done.stderr
    done = ckpt("put", "typed", "--type", "not a type", *t, stdin=b"")
    assert done.returncode == 2 and b"--type 'not a type' is not a message type's full name" in done.stderr


def _typed_store(data: Path) -> None:
    with Store(StoreConfig(data_dir=data)) as store:
        store.register_types(descriptor_set_of(agent_file()))
        store.put("typed", agent_step(agent_state_class(), 1).SerializeToString(), message_type=AGENT_STATE)
        store.put("plain", b"bytes")


def test_inspect_shows_the_type_and_backup_keeps_the_registered_ones(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _typed_store(data)
    inspect = ckpt("inspect", "typed", "--data-dir", str(data))
    assert inspect.returncode == 0, inspect.stderr
    assert f"message type {AGENT_STATE}" in inspect.stdout.decode().splitlines()[0]
    assert "message type" not in ckpt("inspect", "plain", "--data-dir", str(data)).stdout.decode()
    backup = ckpt("backup", str(tmp_path / "backup"), "--data-dir", str(data))
    assert backup.returncode == 0, backup.stderr
    verify = ckpt("verify", "--data-dir", str(tmp_path / "backup"))
    assert verify.returncode == 0, verify.stderr
    with Store(StoreConfig(data_dir=tmp_path / "backup")) as restored:
        assert restored.message_class(AGENT_STATE) is not None
        restored.put("typed", agent_step(agent_state_class(), 2).SerializeToString())  # still checked: parses


def _types_table(data: Path, change: dict[bytes, bytes | None]) -> None:
    env = lmdb.open(str(data / "lmdb"), max_dbs=8)
    try:
        with env.begin(write=True) as txn:
            types = env.open_db(b"types", txn=txn)
            for key, value in change.items():
                if value is None:
                    txn.delete(key, db=types)
                else:
                    txn.put(key, value, db=types)
    finally:
        env.close()


def test_verify_checks_the_registered_types_and_each_typed_sessions_type(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _typed_store(data)
    verify = ckpt("verify", "--data-dir", str(data))
    assert verify.returncode == 0, verify.stderr
    _types_table(data, {b"acme/agent/v1/state.proto": None})  # the session's type is gone
    verify = ckpt("verify", "--data-dir", str(data))
    assert verify.returncode == 1
    assert (
        "FAIL session 'typed': types table: the session's message type acme.agent.v1.State is neither registered"
        " nor built in" in verify.stderr.decode()
    ), verify.stderr
    assert "verified 2 sessions: 1 ok, 1 failed" in verify.stdout.decode()
    _types_table(data, {b"acme/agent/v1/state.proto": b"\xff\xff"})
    verify = ckpt("verify", "--data-dir", str(data))
    assert verify.returncode == 1
    assert "FAIL types table: file 'acme/agent/v1/state.proto' does not parse" in verify.stderr.decode(), verify.stderr
    # The store still serves its untyped sessions; a typed write names the damage.
    with Store(StoreConfig(data_dir=data)) as store:
        store.put("plain", b"more bytes")
        assert store.get("typed").version == 1
        with pytest.raises(DataLoss, match=r"the types table's file 'acme/agent/v1/state\.proto' does not parse"):
            store.put("typed", b"")
