"""Folding a quiet session's head run (fold_after_quiet_seconds, fold_on_close_seconds): its PATCH head
becomes a FULL frame and each version before it in the run a header-only PREFIX frame, read from the head."""

from __future__ import annotations

import logging
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from ckpt.bench import synthetic
from ckpt.codec import FrameKind, decode_latest, keyframe
from ckpt.sidecar import DataLoss, NotFound, Retention, Store, StoreConfig, WriteMode
from ckpt.sidecar.store import folds, keys, reads
from tests.codec.layout import varint
from tests.store.support import (
    LATER,
    every_version,
    frames_table,
    history_states,
    kinds,
    long_chains,
    merge_patches,
    merged,
    storage_of,
)
from tests.support import ckpt


@pytest.fixture
def config(tmp_path: Path) -> StoreConfig:
    # Folded by the sweeps the tests run (not at close: test_fold_at_close.py).
    return StoreConfig(data_dir=tmp_path / "data", sweep_interval_seconds=3600, fold_on_close_seconds=0)


# -- configuration -------------------------------------------------------------------


def test_fold_options_are_checked_and_zero_turns_folding_off(tmp_path: Path) -> None:
    assert StoreConfig(data_dir=tmp_path).fold_after_quiet_seconds == 60.0
    assert StoreConfig(data_dir=tmp_path).fold_on_close_seconds == 5.0
    assert StoreConfig(data_dir=tmp_path, fold_after_quiet_seconds=0).fold_after_quiet_seconds is None
    with pytest.raises(ValueError, match=r"fold_after_quiet_seconds must be >= 0 \(0 = off\) or None, got -1"):
        StoreConfig(data_dir=tmp_path, fold_after_quiet_seconds=-1)
    with pytest.raises(ValueError, match=r"fold_on_close_seconds must be >= 0 \(0 = off\), got -0.5"):
        StoreConfig(data_dir=tmp_path, fold_on_close_seconds=-0.5)
    with pytest.raises(ValueError, match="fold_on_close_seconds must be a finite number of seconds, got nan"):
        StoreConfig(data_dir=tmp_path, fold_on_close_seconds=float("nan"))


# -- the sweep -------------------------------------------------------------------------


def test_folding_a_merge_session_makes_it_smaller_and_every_version_reads_back(config: StoreConfig) -> None:
    config = long_chains(config)
    patches = merge_patches(1)
    expected = merged(patches)
    with Store(config) as store:
        for p in patches:
            store.put("s", p, mode=WriteMode.MERGE)
        before = store.session("s").stored_bytes
        assert kinds(store, "s") == [FrameKind.FULL] + [FrameKind.PATCH] * 39
        done = store.sweep(now_nanos=time.time_ns() + LATER)
        assert (done.heads_folded, done.keyframes_written) == (1, 0)
        assert kinds(store, "s") == [FrameKind.PREFIX] * 39 + [FrameKind.FULL]
        info = store.session("s")
        assert info.stored_bytes < before
        assert info.stored_bytes == sum(v.stored_bytes for v in store.list_versions("s")[0])
        assert info.chain_start_version == 40
        assert store.get("s").info.frame_kind is FrameKind.FULL  # the cached head's metadata too
        assert every_version(store, "s") == expected
        assert history_states(store, "s") == expected
        # Bounded reads: a PREFIX version's read decodes its source, so the bound is the source's size.
        small = store.get("s", 3, use_cache=False, max_state_bytes=len(expected[-1])).state
        assert small == expected[2]
        # The next write continues a new chain from the FULL head.
        store.put("s", b"\x08\x05", mode=WriteMode.MERGE)
        expected.append(expected[-1] + b"\x08\x05")
        assert kinds(store, "s")[-2:] == [FrameKind.FULL, FrameKind.PATCH]
        assert every_version(store, "s") == expected
    with Store(config) as store:
        assert every_version(store, "s") == expected
        assert history_states(store, "s", page_size=100) == expected


def test_a_second_fold_reads_the_first_run_through_two_hops(config: StoreConfig) -> None:
    config = long_chains(config)
    patches = merge_patches(2, steps=30)
    expected = merged(patches)
    with Store(config) as store:
        for p in patches[:12]:
            store.put("s", p, mode=WriteMode.MERGE)
        assert store.sweep(now_nanos=time.time_ns() + LATER).heads_folded == 1
        for p in patches[12:]:
            store.put("s", p, mode=WriteMode.MERGE)
        assert store.sweep(now_nanos=time.time_ns() + 2 * LATER).heads_folded == 1
        assert kinds(store, "s") == [FrameKind.PREFIX] * 29 + [FrameKind.FULL]
        _, frames = store.frames_of("s")
        sources = [info.state_size for _, info, _ in frames]  # type: ignore[union-attr]
        assert sources == [len(s) for s in expected]
        assert every_version(store, "s") == expected
        assert history_states(store, "s", page_size=5) == expected
    verify = ckpt("verify", "--data-dir", str(config.data_dir))
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_a_delta_head_is_keyframed_not_folded_and_a_replace_session_is_left_alone(config: StoreConfig) -> None:
    config = replace(long_chains(config), keyframe_after_quiet_seconds=30.0)
    states = [s.state for s in synthetic.session(3, steps=8, memory_keys=12, plan_steps=8)]
    patches = merge_patches(4, steps=8)
    with Store(config) as store:
        for s in states:
            store.put("replace", s)
        for p in patches:
            store.put("merge", p, mode=WriteMode.MERGE)
        assert kinds(store, "replace")[-1] is FrameKind.DELTA
        done = store.sweep(now_nanos=time.time_ns() + LATER)
        assert (done.heads_folded, done.keyframes_written) == (1, 1)
        assert kinds(store, "replace")[-2:] == [FrameKind.DELTA, FrameKind.FULL]
        assert kinds(store, "merge") == [FrameKind.PREFIX] * 7 + [FrameKind.FULL]
        assert every_version(store, "replace") == states
        assert every_version(store, "merge") == merged(patches)


def test_sessions_written_within_the_quiet_period_are_not_folded(config: StoreConfig) -> None:
    with Store(config) as store:
        for p in merge_patches(5, steps=6):
            store.put("s", p, mode=WriteMode.MERGE)
        before = kinds(store, "s")
        assert store.sweep(now_nanos=time.time_ns() + 30 * 10**9).heads_folded == 0
        assert kinds(store, "s") == before


def test_a_run_whose_states_are_not_prefixes_is_not_folded(
    config: StoreConfig, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fold compares each version's checksum with the prefix's before it rewrites anything: a frame
    whose header records another state leaves the session as it is."""
    from ckpt.codec import FrameHeader, parse
    from ckpt.sidecar.store import folds

    config = long_chains(config)
    patches = merge_patches(6, steps=6)
    with Store(config) as store:
        for p in patches:
            store.put("s", p, mode=WriteMode.MERGE)

        def lying_parse(frame: memoryview) -> tuple[FrameHeader, memoryview]:
            header, payload = parse(frame)
            if header.version == 3:
                header = header._replace(state_xxh3=header.state_xxh3 ^ 1)
            return header, payload

        # A private hook: the fold's reads, made to find version 3's frame recording another checksum.
        monkeypatch.setattr(folds, "parse", lying_parse)
        with caplog.at_level(logging.WARNING, logger="ckpt.store"):
            assert store.sweep(now_nanos=time.time_ns() + LATER).heads_folded == 0
        monkeypatch.undo()
        assert "version 3: its state is not the first" in caplog.text
        assert kinds(store, "s") == [FrameKind.FULL] + [FrameKind.PATCH] * 5
        assert every_version(store, "s") == merged(patches)


# -- everything else with PREFIX frames present -------------------------------------------


def test_retention_after_a_fold_keeps_exactly_the_versions_asked(tmp_path: Path) -> None:
    """A PREFIX frame depends only on newer frames: retention cuts at it, not at an older chain start."""
    config = long_chains(
        StoreConfig(
            data_dir=tmp_path / "data",
            retention=Retention(keep_last_versions=5),
            sweep_interval_seconds=3600,
            fold_on_close_seconds=0,
        )
    )
    patches = merge_patches(7, steps=20)
    expected = merged(patches)
    with Store(config) as store:
        for p in patches:
            store.put("s", p, mode=WriteMode.MERGE)
        store.sweep(now_nanos=time.time_ns() + LATER)  # retention keeps the whole chain; then the fold
        assert store.session("s").first_version == 1
        done = store.sweep(now_nanos=time.time_ns() + LATER)
        assert done.versions_removed == 15
        info = store.session("s")
        assert (info.first_version, info.version_count) == (16, 5)
        assert [store.get("s", v, use_cache=False).state for v in range(16, 21)] == expected[15:]
        assert history_states(store, "s") == expected[15:]
        assert info.stored_bytes == sum(v.stored_bytes for v in store.list_versions("s")[0])


def test_a_fork_of_a_folded_version_gets_a_full_frame_of_its_state(config: StoreConfig) -> None:
    patches = merge_patches(8, steps=10)
    expected = merged(patches)
    with Store(long_chains(config)) as store:
        for p in patches:
            store.put("s", p, mode=WriteMode.MERGE)
        store.sweep(now_nanos=time.time_ns() + LATER)
        assert kinds(store, "s")[3] is FrameKind.PREFIX
        store.fork("s", 4, "f")
        got = store.get("f", use_cache=False)
        assert (got.state, got.info.frame_kind) == (expected[3], FrameKind.FULL)
        store.put("f", b"\x08\x09", mode=WriteMode.MERGE)
        assert store.get("f", use_cache=False).state == expected[3] + b"\x08\x09"


def test_a_missing_source_is_data_loss_naming_both_versions_and_verify_names_it(config: StoreConfig) -> None:
    patches = merge_patches(9, steps=12)
    with Store(long_chains(config)) as store:
        for p in patches[:8]:
            store.put("s", p, mode=WriteMode.MERGE)
        store.sweep(now_nanos=time.time_ns() + LATER)  # versions 1-7 read from version 8
        for p in patches[8:]:
            store.put("s", p, mode=WriteMode.MERGE)
    with frames_table(config.data_dir) as (txn, frames):
        assert txn.delete(keys.frame_key(keys.session_key("s"), 8), db=frames)
    missing = r"version 5: its state is a prefix of version 8's, whose frame is missing"
    with Store(config, readonly=True) as store, pytest.raises(DataLoss, match=missing):
        store.get("s", 5)
    verify = ckpt("verify", "--data-dir", str(config.data_dir))
    assert verify.returncode == 1
    err = verify.stderr.decode()
    assert "version 1: its state is a prefix of version 8's, whose frame is missing" in err, err
    assert "version 7: its state is a prefix of version 8's, whose frame is missing" in err, err


@pytest.mark.parametrize("byte", [4, 6, 12, -1])  # the window, source, size, checksum
def test_verify_names_a_damaged_prefix_frame(config: StoreConfig, byte: int) -> None:
    patches = merge_patches(10, steps=8)
    with Store(long_chains(config)) as store:
        for p in patches:
            store.put("s", p, mode=WriteMode.MERGE)
        store.sweep(now_nanos=time.time_ns() + LATER)
        assert kinds(store, "s")[3] is FrameKind.PREFIX
    clean = ckpt("verify", "--data-dir", str(config.data_dir))
    assert clean.returncode == 0, clean.stdout + clean.stderr
    key = keys.frame_key(keys.session_key("s"), 4)
    with frames_table(config.data_dir) as (txn, frames):
        raw = txn.get(key, db=frames)
        assert raw is not None
        value = bytearray(raw)
        meta_end = 2 + int.from_bytes(value[:2], "little")
        value[meta_end + byte if byte >= 0 else byte] ^= 0x01
        txn.put(key, bytes(value), db=frames)
    verify = ckpt("verify", "--data-dir", str(config.data_dir))
    assert verify.returncode == 1
    assert "version 4" in verify.stderr.decode(), verify.stderr
    with Store(config, readonly=True) as store, pytest.raises(DataLoss, match="version 4"):
        store.get("s", 4)


def test_inspect_shows_prefix_frames(config: StoreConfig) -> None:
    with Store(long_chains(config)) as store:
        for p in merge_patches(11, steps=4):
            store.put("s", p, mode=WriteMode.MERGE)
        store.sweep(now_nanos=time.time_ns() + LATER)
    shown = ckpt("inspect", "s", "--data-dir", str(config.data_dir))
    assert shown.returncode == 0, shown.stderr
    rows = [line.split()[:3] for line in shown.stdout.decode().splitlines()[2:]]
    assert rows == [["1", "PREFIX", "0"], ["2", "PREFIX", "0"], ["3", "PREFIX", "0"], ["4", "FULL", "0"]]


def test_retention_after_a_fold_releases_the_blobs_no_kept_version_names(tmp_path: Path) -> None:
    """Retention's look at the states kept reads a PREFIX version's names in its source (a newer version
    kept, whose state holds its state): a blob no kept state names is released, one they name stays."""
    config = long_chains(
        StoreConfig(
            data_dir=tmp_path / "data",
            retention=Retention(keep_last_versions=3),
            sweep_interval_seconds=3600,
            fold_on_close_seconds=0,
        )
    )
    with Store(config) as store:
        dropped = store.put_blob("s", [b"never named"])
        named = store.put_blob("s", [b"named by version 2"])
        uri = named.uri.encode()
        patches = [b"\x0a\x01a", b"\x0a" + bytes([len(uri)]) + uri] + [b"\x0a\x01b"] * 6
        for p in patches:
            store.put("s", p, mode=WriteMode.MERGE)
        store.sweep(now_nanos=time.time_ns() + LATER)  # retention keeps the chain from version 1; the fold
        assert kinds(store, "s") == [FrameKind.PREFIX] * 7 + [FrameKind.FULL]
        store.sweep(now_nanos=time.time_ns() + LATER)
        assert store.session("s").first_version == 6
        assert store.blob_refs("s") == [named.sha256]
        with pytest.raises(NotFound):
            store.blob(dropped.sha256)
        assert [store.get("s", v, use_cache=False).state for v in (6, 7, 8)] == merged(patches)[5:]


def test_a_history_page_of_prefix_versions_decodes_their_source_once(
    config: StoreConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page of PREFIX versions whose source (the head) is on no page of its own decodes it once, not once
    per version: the first version read hands the source's state to the others."""
    decodes: list[int] = []

    def counted(*args: object, **kwargs: object) -> object:
        decodes[-1] += 1
        return decode_latest(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(reads, "decode_latest", counted)
    patches = merge_patches(12)
    with Store(long_chains(config)) as store:
        for p in patches:
            store.put("s", p, mode=WriteMode.MERGE)
        store.sweep(now_nanos=time.time_ns() + LATER)
        assert kinds(store, "s") == [FrameKind.PREFIX] * 39 + [FrameKind.FULL]
        states: list[bytes] = []
        token = ""
        while True:
            decodes.append(0)
            page, token = store.list_versions("s", include_states=True, page_size=4, page_token=token)
            states += [got.state for got in page]
            if not token:
                break
    assert states[::-1] == merged(patches)
    # The first page holds the head, decoded with its chain; each later page decodes it once.
    assert decodes == [0] + [1] * 9


def test_a_fold_is_planned_off_the_writer_so_other_sessions_commit_while_it_compresses(
    config: StoreConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoding a quiet head and compressing it again take time in proportion to its state (seconds for a
    150 MB head); done inside the writer's transaction, every other session's writes waited for them. The
    fold now plans on the sweeping thread, after its read transaction, and the writer only writes the plan:
    a put to another session commits while the head is being compressed."""
    config = long_chains(config)
    patches = merge_patches(5)
    expected = merged(patches)
    with Store(config) as store:
        for p in patches:
            store.put("big", p, mode=WriteMode.MERGE)
        committed_meanwhile: list[int] = []
        real_keyframe = keyframe

        def compressing(state: bytes, **kwargs: object) -> object:
            # A private hook: the fold's compression of the head. Another session's put, from another
            # thread, must commit before it returns (10 s: it never would inside the writer's transaction),
            # and no read transaction is open (a long one keeps LMDB from reusing the pages commits free).
            assert storage_of(store)._rw._shared == 0
            if not committed_meanwhile:
                with ThreadPoolExecutor(1) as pool:
                    committed_meanwhile.append(pool.submit(store.put, "other", b"\x08\x01").result(timeout=10).version)
            return real_keyframe(state, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(folds, "keyframe", compressing)
        assert store.sweep(now_nanos=time.time_ns() + LATER).heads_folded == 1
        assert committed_meanwhile == [1]
        assert kinds(store, "big")[-1] is FrameKind.FULL
        assert every_version(store, "big") == expected
        assert store.get("other", use_cache=False).state == b"\x08\x01"
    with Store(config) as store:
        assert every_version(store, "big") == expected


def test_a_large_folded_head_is_folded_again_only_once_its_run_costs_an_eighth_of_it_to_decode(
    config: StoreConfig,
) -> None:
    """A fold writes the head whole. The first fold of a large head pays (its sealed frame decodes in one
    shot); after it, for a head of at least segment_min_state_bytes with a few KB patched on, a rewrite is
    not worth the decode it spares (folds.FOLD_MIN_GAIN_FRACTION). The run is folded once the bytes it added
    and its frames (4 KiB each, the policy's frame_cost_bytes) reach an eighth of the head."""
    body = random.Random(11).randbytes(512 * 1024).hex().encode()  # 1 MiB that compresses about 2:1
    first = b"\x0a" + varint(len(body)) + body
    patches = [b"\x12\x08" + b"%08d" % i for i in range(50)]  # 10 bytes each
    expected = [first]
    with Store(config) as store:

        def merge(ps: list[bytes]) -> None:
            for p in ps:
                store.put("big", p, mode=WriteMode.MERGE)
                expected.append(expected[-1] + p)

        store.put("big", first)
        merge(patches[:10])
        assert store.sweep(now_nanos=time.time_ns() + LATER).heads_folded == 1  # onto the put's FULL frame
        assert kinds(store, "big") == [FrameKind.PREFIX] * 10 + [FrameKind.FULL]
        merge(patches[10:20])  # 10 * (10 B + 4 KiB) < 1 MiB / 8
        assert store.sweep(now_nanos=time.time_ns() + LATER).heads_folded == 0
        assert kinds(store, "big")[10:] == [FrameKind.FULL] + [FrameKind.PATCH] * 10
        assert store.session("big").chain_start_version == 11
        assert every_version(store, "big") == expected
        merge(patches[20:])  # 40 * (10 B + 4 KiB) > 1 MiB / 8
        assert store.sweep(now_nanos=time.time_ns() + LATER).heads_folded == 1
        assert kinds(store, "big") == [FrameKind.PREFIX] * 50 + [FrameKind.FULL]
        assert every_version(store, "big") == expected
    with Store(config) as store:
        assert every_version(store, "big") == expected


def test_folds_whose_commit_grows_the_map_are_written_once(config: StoreConfig) -> None:
    """The writer runs a batch again when it finds the map full and grows it: the fold op's rewrites, worked
    out before, must then write the same frames and records as the first time, the records of sessions
    the first run had already rewritten among them."""
    config = replace(config, map_size_bytes=1 << 20)
    expected: dict[str, list[bytes]] = {}
    with Store(config) as store:
        # "a" is rewritten first in the op; "b"'s new FULL frame is what no longer fits the map.
        for n, (sid, size) in enumerate((("a", 96 * 1024), ("b", 768 * 1024), ("c", 96 * 1024))):
            body = random.Random(n).randbytes(size).hex().encode()
            expected[sid] = [b"\x0a" + varint(len(body)) + body]
            store.put(sid, expected[sid][0])
            for i in range(10):
                patch = b"\x12\x08" + b"%08d" % i
                store.put(sid, patch, mode=WriteMode.MERGE)
                expected[sid].append(expected[sid][-1] + patch)
        resizes = storage_of(store).resizes  # a private hook: how often the map grew
        assert store.sweep(now_nanos=time.time_ns() + LATER).heads_folded == 3  # in one op
        assert storage_of(store).resizes > resizes  # the fold's batch ran again
        stored = {sid: store.session(sid).stored_bytes for sid in expected}
        for sid, states in expected.items():
            assert stored[sid] == sum(v.stored_bytes for v in store.list_versions(sid)[0])
            assert every_version(store, sid) == states
    with Store(config) as store:
        for sid, states in expected.items():
            assert store.session(sid).stored_bytes == stored[sid]
            assert every_version(store, sid) == states
