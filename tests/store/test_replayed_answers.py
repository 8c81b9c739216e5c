"""A retry answered from its request record (a replay) says what the first answer said, chain depth included;
a record kept before the chain depth was answers it 0, and is still read."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import lmdb
import pytest

from ckpt.codec import FrameKind
from ckpt.sidecar import NewEvent, PutRequest, PutResult, Store, StoreConfig, WriteMode
from ckpt.store.v1 import records_pb2
from tests.store.support import CHAINS, merge_patch, replace_state


@pytest.fixture
def config(tmp_path: Path) -> StoreConfig:
    return StoreConfig(data_dir=tmp_path / "data", chain_policy=CHAINS, sweep_interval_seconds=3600)


@pytest.fixture
def store(config: StoreConfig) -> Iterator[Store]:
    with Store(config) as s:
        yield s


def _write_chain(store: Store) -> list[tuple[str, bytes, WriteMode, PutResult]]:
    """Writes of session "s" with request ids, each with its first answer: a FULL frame, then REPLACE writes
    and MERGE patches (DELTA and PATCH frames) deeper and deeper into its chain."""
    done = []
    for version in range(1, 7):
        mode = WriteMode.MERGE if version % 2 == 0 else WriteMode.REPLACE
        state = merge_patch("s", version) if mode is WriteMode.MERGE else replace_state("s", version)
        done.append((f"r{version}", state, mode, store.put("s", state, mode=mode, request_id=f"r{version}")))
    return done


def test_a_replayed_put_answers_the_first_answer_with_its_chain_depth(store: Store) -> None:
    writes = _write_chain(store)
    assert {first.frame_kind for *_, first in writes} >= {FrameKind.FULL, FrameKind.DELTA, FrameKind.PATCH}
    assert max(first.chain_depth for *_, first in writes) >= 3
    for request_id, state, mode, first in writes:
        again = store.put("s", state, mode=mode, request_id=request_id)
        assert again == replace(first, replayed=True), request_id


def test_a_replayed_append_answers_its_puts_first_answer_with_its_chain_depth(store: Store) -> None:
    _write_chain(store)
    put = PutRequest("", merge_patch("s", 7), mode=WriteMode.MERGE)
    first = store.append_events("s", [NewEvent("step")], put=put, request_id="a")
    assert first.put is not None and first.put.chain_depth > 0
    again = store.append_events("s", [NewEvent("step")], put=put, request_id="a")
    assert again.replayed and again.put == replace(first.put, replayed=True)


def test_a_record_kept_without_the_chain_depth_is_replayed_with_depth_0(config: StoreConfig) -> None:
    with Store(config) as store:
        writes = _write_chain(store)
    env = lmdb.open(str(config.data_dir / "lmdb"), max_dbs=16)
    try:
        requests = env.open_db(b"requests")
        with env.begin(write=True) as txn:
            for key, value in list(txn.cursor(db=requests)):
                record = records_pb2.RequestRecord.FromString(value)
                record.ClearField("chain_depth")  # as a ckpt that did not keep it wrote it
                txn.put(key, record.SerializeToString(), db=requests)
    finally:
        env.close()
    with Store(config) as store:
        for request_id, state, mode, first in writes:
            again = store.put("s", state, mode=mode, request_id=request_id)
            assert again == replace(first, replayed=True, chain_depth=0), request_id
