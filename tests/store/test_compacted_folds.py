"""A fold of a typed session whose head carries much that later patches overwrote: the head is stored as its
type's canonical serialization, the run's earlier versions keep their bytes, and a write holding the head's
checksum from before the fold still passes its compare-and-set."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import xxhash

from ckpt.codec import ChainPolicy, FrameKind
from ckpt.sidecar import Store, StoreConfig, VersionConflict, WriteMode
from ckpt.sidecar.client import CheckpointClient, ConflictError
from ckpt.sidecar.store.folds import COMPACT_FOLD_MAX_FRACTION
from ckpt.v1 import checkpoint_pb2 as pb
from tests.store.support import LATER, every_version, history_states, kinds, merge_patches, merged
from tests.support import ckpt, start_sidecar

CHECKPOINT = "ckpt.v1.Checkpoint"
MERGE = WriteMode.MERGE
FULL, PATCH, PREFIX = FrameKind.FULL, FrameKind.PATCH, FrameKind.PREFIX


@pytest.fixture
def config(tmp_path: Path) -> StoreConfig:
    # One run of 40 patches: no chain end, and no compaction by the writer (max_superseded_fraction=1.0),
    # so what the fold does is all there is to see.
    return StoreConfig(
        data_dir=tmp_path / "data",
        sweep_interval_seconds=3600,
        fold_on_close_seconds=0,
        chain_policy=ChainPolicy(max_depth=200, max_decode_cost_ratio=1000.0, max_superseded_fraction=1.0),
    )


def canonical(state: bytes) -> bytes:
    return pb.Checkpoint.FromString(state).SerializeToString(deterministic=True)


def fold(store: Store) -> None:
    assert store.sweep(now_nanos=time.time_ns() + LATER).heads_folded == 1


def test_a_bloated_typed_head_is_folded_canonical_and_every_earlier_version_keeps_its_bytes(
    config: StoreConfig,
) -> None:
    patches = merge_patches(1)  # synthetic steps rewriting working-memory entries and plan steps in place
    expected = merged(patches)
    head = canonical(expected[-1])
    assert len(head) <= 0.4 * len(expected[-1])
    with Store(config) as store:
        for p in patches:
            store.put("s", p, mode=MERGE, message_type=CHECKPOINT)
        assert kinds(store, "s") == [FULL] + [PATCH] * 39
        fold(store)
        # The run's versions are prefixes of version 39's state, stored whole; the head stands alone.
        assert kinds(store, "s") == [PREFIX] * 38 + [FULL, FULL]
        got = store.get("s", use_cache=False)
        assert got.state == head
        assert (got.info.state_size, got.info.state_xxh3) == (len(head), xxhash.xxh3_64_intdigest(head))
        assert got.info.message_type == CHECKPOINT
        hot = store.get("s")  # what the state cache held is the folded head too
        assert (hot.state, hot.info) == (got.state, got.info)
        assert every_version(store, "s") == [*expected[:-1], head]
        assert history_states(store, "s") == [*expected[:-1], head]
        info = store.session("s")
        assert (info.head_version, info.chain_start_version) == (40, 40)
        assert info.stored_bytes == sum(v.stored_bytes for v in store.list_versions("s")[0])
        # The next patch lands on the canonical head.
        store.put("s", patches[0], mode=MERGE, message_type=CHECKPOINT)
        assert store.get("s", use_cache=False).state == head + patches[0]
    with Store(config) as store:
        assert every_version(store, "s") == [*expected[:-1], head, head + patches[0]]
    verify = ckpt("verify", "--data-dir", str(config.data_dir))
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_a_write_holding_the_heads_checksum_from_before_the_fold_still_passes(config: StoreConfig) -> None:
    patches = merge_patches(2)
    with Store(config) as store:
        for name in ("a", "b", "c"):
            written = [store.put(name, p, mode=MERGE, message_type=CHECKPOINT) for p in patches][-1]
            assert store.get(name).info.state_xxh3 == written.state_xxh3
        # No checksum kept means none: 0 names no head, folded or not.
        with pytest.raises(VersionConflict, match="expected_state_xxh3"):
            store.put("c", patches[0], mode=MERGE, expected_state_xxh3=0)
        assert store.sweep(now_nanos=time.time_ns() + LATER).heads_folded == 3
        with pytest.raises(VersionConflict, match="expected_state_xxh3"):
            store.put("c", patches[0], mode=MERGE, expected_state_xxh3=0)
        folded = store.get("a", use_cache=False).info.state_xxh3
        assert folded != written.state_xxh3
        # The checksum the client got when it wrote the head, and the one a read gives now: both name it.
        store.put("a", patches[0], mode=MERGE, expected_version=40, expected_state_xxh3=written.state_xxh3)
        store.put("b", patches[0], mode=MERGE, expected_version=40, expected_state_xxh3=folded)
        with pytest.raises(VersionConflict, match="expected_state_xxh3"):
            store.put("c", patches[0], mode=MERGE, expected_state_xxh3=written.state_xxh3 ^ 1)
        # Once a newer version is the head, the old head's checksums name nothing.
        with pytest.raises(VersionConflict, match="expected_state_xxh3"):
            store.put("a", patches[1], mode=MERGE, expected_state_xxh3=written.state_xxh3)
    with Store(config) as store:  # kept across a restart: it is in the version's record
        store.put("c", patches[0], mode=MERGE, expected_version=40, expected_state_xxh3=written.state_xxh3)
        assert store.session("c").head_version == 41


def test_a_head_that_compacts_by_less_folds_as_the_concatenation(config: StoreConfig) -> None:
    # Each patch appends a message: nothing is overwritten, the canonical bytes are the concatenation's.
    patches = [
        pb.Checkpoint(
            messages=[pb.Message(role=pb.ROLE_ASSISTANT, content=f"step {i} " + "z" * 40)]
        ).SerializeToString()
        for i in range(30)
    ]
    expected = merged(patches)
    assert len(canonical(expected[-1])) > COMPACT_FOLD_MAX_FRACTION * len(expected[-1])
    with Store(config) as store:
        for p in patches:
            store.put("s", p, mode=MERGE, message_type=CHECKPOINT)
        fold(store)
        assert kinds(store, "s") == [PREFIX] * 29 + [FULL]
        assert every_version(store, "s") == expected


def test_a_run_that_added_little_is_not_parsed_and_folds_as_the_concatenation(config: StoreConfig) -> None:
    # The REPLACE that starts the run holds an overwritten goal (stored as written); the patches after it
    # add far less than a quarter of the head, so the fold does not parse the head to find it.
    first = pb.Checkpoint(goal="g" * 3000).SerializeToString() + pb.Checkpoint(goal="h" * 3000).SerializeToString()
    patches = [pb.Checkpoint(step=i).SerializeToString() for i in range(1, 11)]
    expected = merged([first, *patches])
    assert len(canonical(expected[-1])) < 0.6 * len(expected[-1])
    with Store(config) as store:
        store.put("s", first, message_type=CHECKPOINT)
        for p in patches:
            store.put("s", p, mode=MERGE)
        fold(store)
        assert kinds(store, "s") == [PREFIX] * 10 + [FULL]
        assert every_version(store, "s") == expected


def test_an_untyped_session_folds_as_the_concatenation(config: StoreConfig) -> None:
    patches = merge_patches(3)
    with Store(config) as store:
        for p in patches:
            store.put("s", p, mode=MERGE)
        fold(store)
        assert kinds(store, "s") == [PREFIX] * 39 + [FULL]
        assert every_version(store, "s") == merged(patches)


def test_a_run_of_one_patch_keeps_its_first_frame_and_compacts_the_head(config: StoreConfig) -> None:
    first = pb.Checkpoint(step=1, goal="g" * 2000).SerializeToString()
    patch = pb.Checkpoint(step=2, goal="h" * 2000).SerializeToString()
    with Store(config) as store:
        store.put("s", first, message_type=CHECKPOINT)
        store.put("s", patch, mode=MERGE)
        assert kinds(store, "s") == [FULL, PATCH]
        before = store.list_versions("s")[0][-1]
        fold(store)
        assert kinds(store, "s") == [FULL, FULL]
        assert store.list_versions("s")[0][-1] == before  # version 1's frame is as it was
        assert every_version(store, "s") == [first, canonical(first + patch)]
        assert store.get("s").state == pb.Checkpoint(step=2, goal="h" * 2000).SerializeToString(deterministic=True)


def test_a_sidecar_stopped_by_sigterm_serves_the_compacted_head_and_takes_the_old_checksum(tmp_path: Path) -> None:
    data = tmp_path / "data"
    patches = merge_patches(4, steps=30)
    expected = merged(patches)
    sidecar = start_sidecar(data)
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            wrote = [client.merge("agent", p, message_type=CHECKPOINT) for p in patches][-1]
            assert client.get("agent").state == expected[-1]
    finally:
        assert sidecar.stop(signal.SIGTERM) == 0, sidecar.log()
    assert "folded 1 quiet heads at close" in sidecar.log()
    sidecar = start_sidecar(data)
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            got = client.get("agent")
            assert got.state == canonical(expected[-1])
            assert pb.Checkpoint.FromString(got.state) == pb.Checkpoint.FromString(expected[-1])
            assert [client.get("agent", v).state for v in range(1, 30)] == expected[:-1]
            with pytest.raises(ConflictError):
                client.merge("agent", patches[0], expected_state_xxh3=wrote.state_xxh3 ^ 1)
            after = client.merge("agent", patches[0], expected_version=30, expected_state_xxh3=wrote.state_xxh3)
            assert after.version == 31
            assert client.get("agent").state == canonical(expected[-1]) + patches[0]
    finally:
        assert sidecar.stop() == 0, sidecar.log()
