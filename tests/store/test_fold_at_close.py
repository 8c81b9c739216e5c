"""Folding at a clean close (fold_on_close_seconds), the store layout it stamps, and a differential test of
folds against the states written."""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckpt.bench.output import child_pids
from ckpt.codec import ChainPolicy, FrameKind
from ckpt.sidecar import IncompatibleStore, Store, StoreConfig, Unavailable, WriteMode
from ckpt.sidecar.client import CheckpointClient
from ckpt.sidecar.store import layout, lock_data_dir
from ckpt.v1 import service_pb2
from tests.store.support import LATER, every_version, history_states, kinds, merge_patches, merged
from tests.store.support import layout_stamp as stamp
from tests.support import ckpt, start_sidecar

PREFIX, FULL, PATCH = service_pb2.FRAME_KIND_PREFIX, service_pb2.FRAME_KIND_FULL, service_pb2.FRAME_KIND_PATCH


@pytest.fixture
def config(tmp_path: Path) -> StoreConfig:
    return StoreConfig(
        data_dir=tmp_path / "data",
        sweep_interval_seconds=3600,
        chain_policy=ChainPolicy(max_depth=200, max_decode_cost_ratio=1000.0),
    )


def test_a_clean_close_folds_the_heads_written_and_logs_it(
    config: StoreConfig, caplog: pytest.LogCaptureFixture
) -> None:
    expected = {}
    with Store(config) as store:
        for i in range(3):
            patches = merge_patches(20 + i, steps=6 + i)
            for p in patches:
                store.put(f"s{i}", p, mode=WriteMode.MERGE)
            expected[f"s{i}"] = merged(patches)
        with caplog.at_level(logging.INFO, logger="ckpt.store"):
            store.close()
    assert "folded 3 quiet heads at close" in caplog.text
    assert "stopped at fold_on_close_seconds" not in caplog.text
    assert stamp(config.data_dir) == b"7"
    with Store(config) as store:
        for sid, states in expected.items():
            assert kinds(store, sid) == [FrameKind.PREFIX] * (len(states) - 1) + [FrameKind.FULL]
            assert every_version(store, sid) == states
            assert history_states(store, sid) == states


def test_a_close_out_of_time_stops_cleanly_and_leaves_chains_that_the_next_sweep_folds(
    config: StoreConfig, caplog: pytest.LogCaptureFixture
) -> None:
    config = replace(config, fold_on_close_seconds=1e-9)
    patches = merge_patches(30, steps=6)
    with Store(config) as store:
        for p in patches:
            store.put("s", p, mode=WriteMode.MERGE)
        with caplog.at_level(logging.INFO, logger="ckpt.store"):
            store.close()
    assert "folded 0 quiet heads at close" in caplog.text
    assert "stopped at fold_on_close_seconds (1e-09 s): the rest stay chains" in caplog.text
    assert stamp(config.data_dir) == b"6"  # never folded: a ckpt of layout 6 still opens it
    with Store(replace(config, fold_on_close_seconds=0)) as store:
        assert kinds(store, "s") == [FrameKind.FULL] + [FrameKind.PATCH] * 5
        assert every_version(store, "s") == merged(patches)
        assert store.sweep(now_nanos=time.time_ns() + LATER).heads_folded == 1  # the bound did not move
        assert every_version(store, "s") == merged(patches)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"fold_on_close_seconds": 0}, "fold_on_close_seconds 0"),
        ({"fold_after_quiet_seconds": None}, "folding off"),
    ],
)
def test_no_fold_at_close_when_it_is_off(config: StoreConfig, change: dict[str, object], why: str) -> None:
    config = replace(config, **change)  # type: ignore[arg-type]
    with Store(config) as store:
        for p in merge_patches(31, steps=4):
            store.put("s", p, mode=WriteMode.MERGE)
    with Store(config) as store:
        assert kinds(store, "s")[-1] is FrameKind.PATCH, why


def test_only_the_store_that_sweeps_folds_at_close(config: StoreConfig) -> None:
    """With --workers, worker 0 sweeps (and folds at close); the others' stores run no sweeper."""
    with Store(config, sweeper=False) as store:
        for p in merge_patches(32, steps=4):
            store.put("s", p, mode=WriteMode.MERGE)
    with Store(config) as store:
        assert kinds(store, "s")[-1] is FrameKind.PATCH
    with Store(config) as store:
        assert kinds(store, "s")[-1] is FrameKind.FULL  # the close before folded it


def test_writes_after_close_began_are_refused_while_it_folds(config: StoreConfig) -> None:
    store = Store(config)
    for p in merge_patches(33, steps=4):
        store.put("s", p, mode=WriteMode.MERGE)
    store.close()
    with pytest.raises(Unavailable):
        store.put("s", b"\x08\x01", mode=WriteMode.MERGE)
    store.close()  # again: nothing more to do


def test_a_backup_of_a_folded_store_reads_back_in_the_same_layout(config: StoreConfig, tmp_path: Path) -> None:
    patches = merge_patches(37, steps=6)
    with Store(config) as store:
        for p in patches:
            store.put("s", p, mode=WriteMode.MERGE)
    backup = tmp_path / "backup"
    done = ckpt("backup", str(backup), "--data-dir", str(config.data_dir))
    assert done.returncode == 0, done.stderr
    assert stamp(backup) == b"7"
    verify = ckpt("verify", "--data-dir", str(backup))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    with Store(replace(config, data_dir=backup), readonly=True) as restored:
        assert kinds(restored, "s") == [FrameKind.PREFIX] * 5 + [FrameKind.FULL]
        assert every_version(restored, "s") == merged(patches)


# -- the layout -------------------------------------------------------------------------------


def test_the_first_fold_stamps_layout_7_which_a_layout_6_ckpt_refuses(config: StoreConfig) -> None:
    config = replace(config, fold_on_close_seconds=0)
    with Store(config) as store:
        for p in merge_patches(34, steps=5):
            store.put("s", p, mode=WriteMode.MERGE)
    assert stamp(config.data_dir) == b"6"
    with _layout_version(6), Store(config) as old:  # an older ckpt opens a store never folded
        assert old.get("s").state == merged(merge_patches(34, steps=5))[-1]
    with Store(config) as store:
        assert store.sweep(now_nanos=time.time_ns() + LATER).heads_folded == 1
    assert stamp(config.data_dir) == b"7"
    with _layout_version(6), pytest.raises(IncompatibleStore, match="store layout 7; this ckpt reads layout 6"):
        Store(config)
    with Store(config, readonly=True) as reader:  # this ckpt reads it, read-only too
        assert every_version(reader, "s") == merged(merge_patches(34, steps=5))
    with Store(config) as store:  # and opens it writable without stamping it back
        store.put("s", b"\x08\x02", mode=WriteMode.MERGE)
    assert stamp(config.data_dir) == b"7"


class _layout_version:
    """The store code reading layouts up to ``version`` only: an older ckpt, as far as the stamp goes."""

    def __init__(self, version: int) -> None:
        self.version = version

    def __enter__(self) -> None:
        self.before = layout.LAYOUT_VERSION
        layout.LAYOUT_VERSION = self.version  # a private hook: the layout this code reads is a module constant

    def __exit__(self, *exc: object) -> None:
        layout.LAYOUT_VERSION = self.before


# -- a real sidecar ------------------------------------------------------------------------------


def test_a_sidecar_stopped_by_sigterm_serves_folded_heads_when_restarted(tmp_path: Path) -> None:
    data = tmp_path / "data"
    patches = merge_patches(35, steps=6)
    sidecar = start_sidecar(data)
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            for p in patches:
                client.merge("agent", p)
            assert next(client.history("agent")).frame_kind == PATCH
    finally:
        assert sidecar.stop(signal.SIGTERM) == 0, sidecar.log()
    assert "folded 1 quiet heads at close" in sidecar.log()
    sidecar = start_sidecar(data)
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            history = list(client.history("agent"))
            assert [v.frame_kind for v in history] == [FULL] + [PREFIX] * 5
            assert [client.get("agent", v).state for v in range(1, 7)] == merged(patches)
            assert [v.state for v in client.history("agent", include_states=True)][::-1] == merged(patches)
            client.merge("agent", b"\x08\x07")
            assert client.get("agent").state == merged(patches)[-1] + b"\x08\x07"
    finally:
        assert sidecar.stop() == 0, sidecar.log()


def test_a_sidecar_killed_leaves_chains_that_read_back(tmp_path: Path) -> None:
    data = tmp_path / "data"
    patches = merge_patches(36, steps=6)
    sidecar = start_sidecar(data)
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            for p in patches:
                client.merge("agent", p)
        store_processes = child_pids(sidecar.pid)
        assert store_processes
        for pid in store_processes:  # stopped where it is: it runs nothing of a close
            os.kill(pid, signal.SIGSTOP)
    finally:
        sidecar.stop(signal.SIGKILL)
    for pid in store_processes:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while True:  # the killed processes' descriptors closed: the data directory's lock is free
        try:
            lock_data_dir(data).close()
            break
        except Unavailable:
            assert time.monotonic() < deadline, "the data directory is still locked"
            time.sleep(0.02)
    with Store(StoreConfig(data_dir=data, fold_on_close_seconds=0)) as store:
        assert kinds(store, "agent")[1:] == [FrameKind.PATCH] * 5
        assert every_version(store, "agent") == merged(patches)


# -- a differential test ----------------------------------------------------------------------------

_patch = st.binary(min_size=0, max_size=40).map(lambda b: b"\x0a" + bytes([len(b)]) + b)
_step = st.one_of(
    st.tuples(st.just("merge"), _patch),
    st.tuples(st.just("replace"), _patch),
    st.tuples(st.just("sweep"), st.just(b"")),
    st.tuples(st.just("reopen"), st.just(b"")),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(_step, min_size=1, max_size=40), max_depth=st.sampled_from([4, 200]))
def test_folds_at_any_point_keep_every_version_as_written(steps: list[tuple[str, bytes]], max_depth: int) -> None:
    """Random MERGE and REPLACE writes, with sweeps (each folding what the writes left) and reopenings
    (each close folding too) at random points: every version reads back as written, one by one and by
    history pages, after every sweep and at the end."""
    with tempfile.TemporaryDirectory() as tmp:
        config = StoreConfig(
            data_dir=Path(tmp) / "data",
            sweep_interval_seconds=3600,
            chain_policy=ChainPolicy(max_depth=max_depth, max_decode_cost_ratio=1000.0),
        )
        written: list[bytes] = []
        later = 0
        store = Store(config)
        try:
            for op, data in steps:
                if op == "merge":
                    store.put("s", data, mode=WriteMode.MERGE)
                    written.append((written[-1] if written else b"") + data)
                elif op == "replace":
                    store.put("s", data)
                    written.append(data)
                elif op == "sweep":
                    later += LATER
                    store.sweep(now_nanos=time.time_ns() + later)
                    if written:
                        assert every_version(store, "s") == written
                else:
                    store.close()
                    store = Store(config)
            if written:
                assert every_version(store, "s") == written
                assert history_states(store, "s", page_size=3) == written
                info = store.session("s")
                assert info.stored_bytes == sum(v.stored_bytes for v in store.list_versions("s", page_size=1000)[0])
        finally:
            store.close()
        if written:
            with Store(config) as reopened:
                assert every_version(reopened, "s") == written
                assert kinds(reopened, "s")[-1] in (FrameKind.FULL, FrameKind.DELTA)
