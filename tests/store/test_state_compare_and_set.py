"""Compare-and-set on the head's content (expected_state_xxh3) in the embedded store, and the state_xxh3 every
VersionInfo and PutResult carries."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import xxhash

from ckpt.sidecar import InvalidArgument, PutRequest, Store, StoreConfig, VersionConflict, WriteMode
from ckpt.sidecar.store.requestids import write_fingerprint
from ckpt.v1 import checkpoint_pb2 as pb
from tests.store.support import CHAINS, patch_of, state_of

MERGE = WriteMode.MERGE


def xxh3(state: bytes) -> int:
    return xxhash.xxh3_64_intdigest(state)


@pytest.fixture
def config(tmp_path: Path) -> StoreConfig:
    return StoreConfig(data_dir=tmp_path / "data", chain_policy=CHAINS, sweep_interval_seconds=3600)


@pytest.fixture
def store(config: StoreConfig) -> Iterator[Store]:
    with Store(config) as s:
        yield s


def test_every_version_info_and_put_result_carries_its_states_xxh3(store: Store) -> None:
    for v in range(1, 4):
        put = store.put("r", state_of("r", v))
        assert put.state_xxh3 == xxh3(state_of("r", v))
    put = store.put("r", patch_of(4), mode=MERGE)
    head = store.get("r")
    assert put.state_xxh3 == head.info.state_xxh3 == xxh3(head.state) != 0
    old = store.get("r", 2)
    assert old.info.state_xxh3 == xxh3(state_of("r", 2))
    infos, _ = store.list_versions("r")
    with_states, _ = store.list_versions("r", include_states=True)
    assert (
        [i.state_xxh3 for i in infos]
        == [g.info.state_xxh3 for g in with_states]
        == [xxh3(g.state) for g in with_states]
    )


def test_a_typed_merge_heads_xxh3_is_that_of_its_compacted_state(store: Store) -> None:
    expected = pb.Checkpoint()
    for step in range(1, 20):  # each patch overwrites step and goal: compaction drops what they replace
        patch = pb.Checkpoint(step=step, goal=f"goal {step} " + "g" * 200)
        expected.MergeFrom(patch)
        put = store.put("typed", patch.SerializeToString(), mode=MERGE, message_type="ckpt.v1.Checkpoint")
    head = store.get("typed")
    assert pb.Checkpoint.FromString(head.state) == expected
    assert len(head.state) < 19 * 200  # compacted, not every patch kept
    assert put.state_xxh3 == head.info.state_xxh3 == xxh3(head.state)
    store.put("typed", pb.Checkpoint(step=20).SerializeToString(), mode=MERGE, expected_state_xxh3=put.state_xxh3)


@pytest.mark.parametrize("cold", [False, True], ids=["cached-encoder", "head-frame"])
def test_a_session_deleted_and_written_again_to_the_same_version_fails_the_state_check(
    config: StoreConfig, cold: bool
) -> None:
    store = Store(config)
    try:
        store.put("s", state_of("a", 1))
        a_head = store.put("s", state_of("a", 2))
        store.delete_session("s")
        store.put("s", state_of("b", 1))
        store.put("s", state_of("b", 2))
        if cold:  # no cached encoder: the head frame's header answers
            store.close()
            store = Store(config)
        with pytest.raises(VersionConflict) as info:
            store.put("s", patch_of(3), mode=MERGE, expected_version=2, expected_state_xxh3=a_head.state_xxh3)
        assert str(info.value) == (
            f"session 's': expected_state_xxh3 {a_head.state_xxh3:#018x} but the head, version 2, holds another state"
        )
        assert info.value.current_version == 2
        assert store.get("s").state == state_of("b", 2)  # nothing written
        b_head = store.get("s").info.state_xxh3
        assert store.put("s", patch_of(3), mode=MERGE, expected_state_xxh3=b_head).version == 3
    finally:
        store.close()


def test_a_write_without_the_state_check_is_not_held_to_it(store: Store) -> None:
    store.put("s", state_of("a", 1))
    store.delete_session("s")
    store.put("s", state_of("b", 1))
    assert store.put("s", patch_of(2), mode=MERGE, expected_version=1).version == 2  # the version alone holds


def test_with_expected_version_too_both_must_hold(store: Store) -> None:
    head = store.put("s", state_of("s", 1)).state_xxh3
    with pytest.raises(VersionConflict, match="expected_version 2 but the head is version 1"):
        store.put("s", state_of("s", 2), expected_version=2, expected_state_xxh3=head)
    with pytest.raises(VersionConflict, match=r"expected_state_xxh3 .* but the head, version 1, holds another state"):
        store.put("s", state_of("s", 2), expected_version=1, expected_state_xxh3=head ^ 1)
    assert store.put("s", state_of("s", 2), expected_version=1, expected_state_xxh3=head).version == 2


@pytest.mark.parametrize("expected", [0, xxh3(b"")])
def test_a_session_without_versions_matches_no_state_xxh3(store: Store, expected: int) -> None:
    with pytest.raises(VersionConflict) as info:
        store.put("absent", b"", expected_state_xxh3=expected)
    assert str(info.value) == (
        f"session 'absent': expected_state_xxh3 {expected:#018x} but the session has no versions"
        " (the head is version 0)"
    )
    assert info.value.current_version == 0


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-1, "expected_state_xxh3 must be in 0..2**64-1 (a uint64), got -1"),
        (2**64, f"expected_state_xxh3 must be in 0..2**64-1 (a uint64), got {2**64}"),
        (True, "expected_state_xxh3 must be an int or None, not bool"),
    ],
)
def test_expected_state_xxh3_is_a_uint64(store: Store, value: int, message: str) -> None:
    store.put("s", b"\x08\x01")
    with pytest.raises(InvalidArgument) as info:
        store.put("s", b"\x08\x02", expected_state_xxh3=value)
    assert str(info.value) == message


def test_a_retry_answers_the_recorded_state_xxh3_and_must_resend_the_same_check(store: Store) -> None:
    head = store.put("s", state_of("s", 1)).state_xxh3
    first = store.put("s", patch_of(2), mode=MERGE, request_id="r", expected_state_xxh3=head)
    store.put("s", state_of("s", 3))  # the head moves on: the retry still answers the first write
    again = store.put("s", patch_of(2), mode=MERGE, request_id="r", expected_state_xxh3=head)
    assert again.replayed and again.state_xxh3 == first.state_xxh3 == store.get("s", 2).info.state_xxh3
    with pytest.raises(InvalidArgument, match="request_id 'r' was used for a different write"):
        store.put("s", patch_of(2), mode=MERGE, request_id="r", expected_state_xxh3=head ^ 1)
    with pytest.raises(InvalidArgument, match="request_id 'r' was used for a different write"):
        store.put("s", patch_of(2), mode=MERGE, request_id="r")


def test_a_put_in_an_append_checks_and_replays_the_state_xxh3(store: Store) -> None:
    head = store.put("s", state_of("s", 1)).state_xxh3
    put = PutRequest("", state_of("s", 2), expected_state_xxh3=head ^ 1)
    with pytest.raises(VersionConflict, match="expected_state_xxh3"):
        store.append_events("s", [], put=put, request_id="a")
    put = replace(put, expected_state_xxh3=head)
    first = store.append_events("s", [], put=put, request_id="a")
    again = store.append_events("s", [], put=put, request_id="a")
    assert first.put is not None and again.put is not None and again.replayed
    assert first.put.state_xxh3 == again.put.state_xxh3 == xxh3(state_of("s", 2))


def test_fingerprints_of_writes_without_the_state_check_stay_what_they_were() -> None:
    # Values of records stored before expected_state_xxh3 existed: their retries must still match.
    typed = PutRequest("s", b"\x08\x01", MERGE, 3, "r", {"k": "v"}, "ckpt.v1.Checkpoint")
    assert write_fingerprint(typed, MERGE) == 9245635322489536529
    assert write_fingerprint(PutRequest("s", b"\x08\x01"), WriteMode.REPLACE) == 573684866707885799
    assert write_fingerprint(replace(typed, expected_state_xxh3=0), MERGE) != 9245635322489536529
