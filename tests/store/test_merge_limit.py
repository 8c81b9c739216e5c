"""A MERGE checked against max_state_bytes: a typed session's merged state counts without the fields its
patches overwrote (stored compacted when only that fits), so a large field can be rewritten for ever; a
state too large even so is refused with its size, and the head stays."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt.codec import ChainPolicy, FrameKind
from ckpt.sidecar import ResourceExhausted, Store, StoreConfig, WriteMode
from ckpt.v1 import checkpoint_pb2 as pb
from tests.store.support import kinds

CHECKPOINT = "ckpt.v1.Checkpoint"
FULL, PATCH = FrameKind.FULL, FrameKind.PATCH
LIMIT = 4000
GOAL = "g" * 1500  # two revisions fit as merged, three do not; one fits compacted


@pytest.fixture
def config(tmp_path: Path) -> StoreConfig:
    # No compaction but the limit's: the writer's superseded-bytes rule would restart the chain sooner.
    return StoreConfig(
        data_dir=tmp_path / "data",
        sweep_interval_seconds=3600,
        fold_on_close_seconds=0,
        max_state_bytes=LIMIT,
        chain_policy=ChainPolicy(max_depth=200, max_decode_cost_ratio=1000.0, max_superseded_fraction=1.0),
    )


def test_a_large_field_rewritten_by_merges_is_compacted_at_the_limit_not_refused(config: StoreConfig) -> None:
    merged = pb.Checkpoint()
    states = []
    with Store(config) as store:
        for i in range(10):
            patch = pb.Checkpoint(step=i, goal=f"{GOAL}{i}")
            merged.MergeFrom(patch)
            result = store.put("s", patch.SerializeToString(), mode=WriteMode.MERGE, message_type=CHECKPOINT)
            assert result.version == i + 1
            got = store.get("s", use_cache=False)
            assert pb.Checkpoint.FromString(got.state) == merged and got.info.state_size <= LIMIT
            states.append(got.state)
        # A chain started (compacted) whenever the next revision would not fit beside the last two.
        assert kinds(store, "s") == [FULL, PATCH] * 5
    with Store(config) as store:  # reopened: every version as it was answered
        assert [store.get("s", version).state for version in range(1, 11)] == states


def test_a_merge_too_large_even_compacted_is_refused_with_its_size(config: StoreConfig) -> None:
    with Store(config) as store:
        store.put("s", pb.Checkpoint(goal=GOAL).SerializeToString(), mode=WriteMode.MERGE, message_type=CHECKPOINT)
        head = store.get("s")
        grown = pb.Checkpoint(messages=[pb.Message(content="m" * 2600)]).SerializeToString()
        size = head.info.state_size + len(grown)  # nothing overwritten: compacting saves nothing
        with pytest.raises(
            ResourceExhausted, match=rf"would make a state of {size} bytes, over max_state_bytes \({LIMIT}\)"
        ):
            store.put("s", grown, mode=WriteMode.MERGE, message_type=CHECKPOINT)
        after = store.get("s", use_cache=False)
        assert (after.version, after.state) == (head.version, head.state)
    with Store(config) as store:
        assert store.session("s").head_version == 1
