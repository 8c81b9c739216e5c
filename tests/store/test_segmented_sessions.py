"""Sessions whose MERGE chains hold segment frames (codec FORMAT.md §14), on a real LMDB directory.

Every version read cold after a reopen, in history pages and through the head's cache, against a model
of MERGE and REPLACE; writes going on after a reopen; retention, fork and `ckpt verify` on them; a
segment whose base frame is missing named as lost.
"""

from __future__ import annotations

import random
from pathlib import Path

import lmdb
import pytest

from ckpt.codec import ChainPolicy, FrameKind, parse
from ckpt.sidecar import Store, StoreConfig, WriteMode
from ckpt.sidecar.config import Retention
from ckpt.sidecar.errors import DataLoss, IncompatibleStore
from ckpt.sidecar.store import keys, layout
from tests.support import ckpt

NO_SWEEPER = 100 * 365 * 86400.0
#: Segments on states of any size, at every second version (fanout 2); chains of at most 40 versions.
POLICY = ChainPolicy(
    segment_fanout=2,
    segment_min_state_bytes=0,
    segment_max_fraction=1.0,
    max_chain_versions=40,
    frame_cost_bytes=0,
    max_delta_to_full_ratio=1.0,
)


def _patch(rnd: random.Random, i: int) -> bytes:
    text = f"step {i}: ".encode() + bytes(rnd.randrange(97, 123) for _ in range(rnd.randrange(0, 80)))
    return bytes([0x0A, len(text)]) + text


def _write(store: Store, session: str, model: list[bytes], rnd: random.Random, count: int) -> None:
    """``count`` writes, one in ten a REPLACE, appended to ``model`` (model[v - 1] is version v's state)."""
    for _ in range(count):
        i = len(model) + 1
        patch = _patch(rnd, i)
        if i % 10 == 7:
            state = patch
            store.put(session, state)
        else:
            state = (model[-1] if model else b"") + patch
            store.put(session, patch, mode=WriteMode.MERGE)
        model.append(state)
        assert store.get(session).state == state  # the head, as the cache answers it


def _frames(data: Path, session: str) -> dict[int, bytes]:
    env = lmdb.open(str(data / "lmdb"), max_dbs=16, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            sid = keys.session_key(session)
            cursor = txn.cursor(db=env.open_db(b"frames", txn=txn))
            out = {}
            if cursor.set_range(keys.frame_key(sid, 0)):
                for key, value in cursor:
                    if not key.startswith(sid + keys.SEP):
                        break
                    out[keys.frame_version(key, sid)] = bytes(value)
            return out
    finally:
        env.close()


def _segments(data: Path, session: str) -> list[tuple[int, int]]:
    """(version, base version) of every segment frame stored for ``session``."""
    found = []
    for version, value in _frames(data, session).items():
        at = value.find(b"CK\x02")  # the frame inside its stored value
        header, _ = parse(value[at:])
        if header.kind is FrameKind.PATCH and header.base_version < version - 1:
            found.append((version, header.base_version))
    return found


@pytest.fixture
def config(tmp_path: Path) -> StoreConfig:
    # No fold at close: the frames stay as the writes made them (a fold turns a head run into PREFIX frames).
    return StoreConfig(
        data_dir=tmp_path / "data", chain_policy=POLICY, sweep_interval_seconds=NO_SWEEPER, fold_on_close_seconds=0
    )


def test_every_version_reads_back_cold_in_history_and_after_more_writes(config: StoreConfig) -> None:
    rnd, model = random.Random(7), list[bytes]()
    with Store(config) as store:
        _write(store, "s", model, rnd, 90)
    segments = _segments(config.data_dir, "s")
    assert len(segments) > 20 and any(version - base > 2 for version, base in segments)
    # inspect names each frame's base, and counts the frames a version is read through.
    lines = ckpt("inspect", "s", "--data-dir", str(config.data_dir)).stdout.decode().splitlines()
    rows = {int(line.split()[0]): line.split() for line in lines[2:]}
    for version, base in segments:
        assert rows[version][3] == str(base) and int(rows[version][2]) == int(rows[base][2]) + 1
    with Store(config) as store:  # reopened: no encoder, no cached state
        for version, state in enumerate(model, 1):
            assert store.get("s", version, use_cache=False).state == state
        _write(store, "s", model, rnd, 50)  # an encoder resumed from the stored chain
    with Store(config) as store:
        for version, state in enumerate(model, 1):
            assert store.get("s", version, use_cache=False).state == state
        token, seen = "", {}
        while True:
            page, token = store.list_versions("s", page_size=7, page_token=token, include_states=True)
            seen.update({got.version: got.state for got in page})
            if not token:
                break
        assert seen == dict(enumerate(model, 1))
    code, out = _verify(config.data_dir)
    assert code == 0, out


def test_retention_and_fork_keep_what_they_promise(tmp_path: Path) -> None:
    config = StoreConfig(
        data_dir=tmp_path / "data",
        chain_policy=POLICY,
        sweep_interval_seconds=NO_SWEEPER,
        retention=Retention(keep_last_versions=5),
    )
    rnd, model = random.Random(3), list[bytes]()
    with Store(config) as store:
        _write(store, "s", model, rnd, 120)
        store.sweep()
    kept = sorted(_frames(config.data_dir, "s"))
    # Whole chains go: the last five versions' chain stays, at most max_chain_versions versions.
    assert kept[-1] == 120 and 5 <= len(kept) <= 40 and kept == list(range(kept[0], 121))
    segment = max(v for v, base in _segments(config.data_dir, "s") if v - base > 2)
    with Store(config) as store:
        for version in kept:
            assert store.get("s", version, use_cache=False).state == model[version - 1]
        store.fork("s", segment, "f")
        assert store.get("f", 1, use_cache=False).state == model[segment - 1]
    code, out = _verify(config.data_dir)
    assert code == 0, out


def test_a_segment_whose_base_frame_is_missing_is_named_as_lost(config: StoreConfig) -> None:
    rnd, model = random.Random(5), list[bytes]()
    with Store(config) as store:
        text = bytes(rnd.randrange(97, 123) for _ in range(3000))
        model.append(b"\x12\xb8\x17" + text)  # field 2, 3,000 bytes
        store.put("s", model[0], mode=WriteMode.MERGE)
        _write(store, "s", model, rnd, 5)  # versions 2-6: 3 and 5 are segments over 1, 5 over four versions
    assert (5, 1) in _segments(config.data_dir, "s")
    env = lmdb.open(str(config.data_dir / "lmdb"), max_dbs=16)
    with env.begin(write=True) as txn:
        assert txn.delete(keys.frame_key(keys.session_key("s"), 1), db=env.open_db(b"frames", txn=txn))
    env.close()
    with Store(config) as store, pytest.raises(DataLoss, match="the frame of version 1 is missing"):
        store.get("s", 5, use_cache=False)
    code, out = _verify(config.data_dir)
    assert code != 0 and "version 1" in out, out


def _verify(data: Path) -> tuple[int, str]:
    result = ckpt("verify", "--data-dir", str(data))
    return result.returncode, (result.stdout + result.stderr).decode()


def test_the_first_segment_stamps_layout_9_and_an_older_ckpt_refuses_the_store(config: StoreConfig) -> None:
    rnd, model = random.Random(11), list[bytes]()
    with Store(config) as store:
        _write(store, "s", model, rnd, 2)  # versions 1-2: no segment yet
    assert _stamp(config.data_dir) == b"6"
    with Store(config) as store:
        _write(store, "s", model, rnd, 1)  # version 3: a segment over versions 2-3, on 1
    assert (3, 1) in _segments(config.data_dir, "s") and _stamp(config.data_dir) == b"9"
    before = layout.LAYOUT_VERSION
    layout.LAYOUT_VERSION = 8  # a private hook: this code as a ckpt reading layouts up to 8
    try:
        with pytest.raises(IncompatibleStore, match="store layout 9; this ckpt reads layout 8"):
            Store(config)
    finally:
        layout.LAYOUT_VERSION = before
    with Store(config) as store:
        assert [store.get("s", v, use_cache=False).state for v in (1, 2, 3)] == model


def _stamp(data: Path) -> bytes | None:
    env = lmdb.open(str(data / "lmdb"), max_dbs=16, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            raw = txn.get(b"layout_version", db=env.open_db(b"meta", txn=txn))
            return None if raw is None else bytes(raw)
    finally:
        env.close()
