"""The cold read of a folded head: its one sealed FULL frame found with one cursor step and decoded in one
shot (reads._sealed_head), answering exactly as the chain read does; any other head, and any doubt, left to
the chain read, which names the error. And the result's info, read from the stored metadata when asked."""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from dataclasses import FrozenInstanceError, replace
from pathlib import Path
from typing import Any

import pytest

from ckpt.codec import ChainPolicy, FrameKind
from ckpt.sidecar import DataLoss, GetResult, StateTooLarge, Store, StoreConfig, WriteMode
from ckpt.sidecar.store import headreads, keys, reads, writeops
from tests.store.support import LATER, frames_table, long_chains, merge_patches, merged

SESSIONS = ("a", "b", "c")


@pytest.fixture
def config(tmp_path: Path) -> StoreConfig:
    # Folded by the sweep the tests run, not at close.
    return StoreConfig(data_dir=tmp_path / "data", sweep_interval_seconds=3600, fold_on_close_seconds=0)


def _write(config: StoreConfig, *, fold: bool = True) -> dict[str, list[bytes]]:
    """Three MERGE sessions of 12 versions, labelled, folded by a sweep unless ``fold`` is False; their
    states by session."""
    states: dict[str, list[bytes]] = {}
    with Store(long_chains(config)) as store:
        for seed, session in enumerate(SESSIONS):
            patches = merge_patches(seed, steps=12)
            for p in patches:
                store.put(session, p, mode=WriteMode.MERGE, labels={"session": session})
            states[session] = merged(patches)
        if fold:
            assert store.sweep(now_nanos=time.time_ns() + LATER).heads_folded == len(SESSIONS)
    return states


def _counting_chain_reads(monkeypatch: pytest.MonkeyPatch, module: Any = reads) -> list[int]:
    """The versions asked of the chain read (reads.chain_back, as ``module`` calls it), as they are asked."""
    asked: list[int] = []
    real: Callable[..., Any] = reads.chain_back

    def chain_back(*args: Any, **kwargs: Any) -> Any:
        asked.append(args[4])
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "chain_back", chain_back)
    return asked


def test_a_folded_head_reads_in_one_step_as_the_chain_read_reads_it(
    config: StoreConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    states = _write(config)
    asked = _counting_chain_reads(monkeypatch)
    with Store(config) as store:
        asked.clear()  # what opening the store read
        for session, expected in states.items():
            head = store.get(session, use_cache=False)
            assert asked == []  # no chain read: the sealed frame alone
            by_version = store.get(session, len(expected), use_cache=False)
            assert asked == [len(expected)]
            asked.clear()
            assert head.state == by_version.state == expected[-1]
            assert head.version == by_version.version == len(expected)
            assert head.info == by_version.info and head == by_version
            assert head.info.frame_kind is FrameKind.FULL
            assert head.info.labels == {"session": session} and head.info.mode is WriteMode.MERGE
            assert head.info.state_size == len(expected[-1])
            # The versions before it read from it as they did.
            assert [store.get(session, v, use_cache=False).state for v in range(1, len(expected))] == expected[:-1]
            asked.clear()


def test_a_head_that_is_not_one_sealed_frame_is_read_through_its_chain(
    config: StoreConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    states = _write(config, fold=False)
    asked = _counting_chain_reads(monkeypatch)
    with Store(config) as store:
        asked.clear()
        for session, expected in states.items():
            got = store.get(session, use_cache=False)
            assert got.state == expected[-1] and got.info.frame_kind is FrameKind.PATCH
        assert asked == [0] * len(SESSIONS)


def _sealed_head(store: Store, session: str) -> bool:
    """Whether the session's head is stored as one sealed FULL frame (codec FORMAT.md §13)."""
    _, frames = store.frames_of(session)
    return bytes(frames[-1][2][2:4]) == b"\x02\x09"


@pytest.mark.parametrize("sweep", ["folds", "keyframes"])
def test_a_merge_keyframe_at_the_head_is_sealed_once_quiet_and_then_read_in_one_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sweep: str
) -> None:
    """The FULL frame a MERGE write stores to start a chain (its zstd stream left open for the PATCH frames
    after it) is sealed by either quiet sweep once it is the quiet head; a REPLACE session's FULL head is
    left as it is; nothing else about the session changes."""
    config = StoreConfig(
        data_dir=tmp_path / "data",
        sweep_interval_seconds=3600,
        fold_on_close_seconds=0,
        chain_policy=ChainPolicy(max_depth=5),  # version 7 starts a chain: a FULL frame at the head
    )
    if sweep == "keyframes":
        config = replace(config, fold_after_quiet_seconds=None, keyframe_after_quiet_seconds=60)
    patches = merge_patches(3, steps=7)
    state = merged(patches)[-1]
    with Store(config) as store:
        for p in patches:
            store.put("s", p, mode=WriteMode.MERGE, labels={"k": "v"})
        store.put("replaced", b"\x08\x01")
        head = store.session("s").head_version
        assert store.session("s").chain_start_version == head == 7 and not _sealed_head(store, "s")
        before = [store.get("s", v, use_cache=False) for v in range(1, head + 1)]
        done = store.sweep(now_nanos=time.time_ns() + LATER)
        assert (done.heads_folded, done.keyframes_written) == ((1, 0) if sweep == "folds" else (0, 1))
        assert _sealed_head(store, "s") and not _sealed_head(store, "replaced")
        again = store.sweep(now_nanos=time.time_ns() + LATER)
        assert (again.heads_folded, again.keyframes_written) == (0, 0)
        after = [store.get("s", v, use_cache=False) for v in range(1, head + 1)]
        assert [g.state for g in after] == [g.state for g in before]
        assert replace(after[-1].info, stored_bytes=before[-1].info.stored_bytes) == before[-1].info  # a new frame
        assert store.session("s").stored_bytes == sum(v.stored_bytes for v in store.list_versions("s")[0])
        store.put("s", b"\x08\x09", mode=WriteMode.MERGE)  # the next write goes on from the sealed frame
        assert store.get("s", use_cache=False).state == state + b"\x08\x09"
    asked = _counting_chain_reads(monkeypatch)
    with Store(config) as store:
        asked.clear()
        assert store.get("s", head, use_cache=False).state == state
        assert store.get("s", use_cache=False).state == state + b"\x08\x09"


def test_a_merge_keyframe_of_a_large_state_is_not_sealed_again(
    config: StoreConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its read is mostly its decode; sealing it would decode and compress it whole."""
    monkeypatch.setattr(writeops, "SEAL_BELOW_BYTES", 64)
    with Store(replace(config, chain_policy=ChainPolicy(max_depth=5))) as store:
        for p in merge_patches(3, steps=7):
            store.put("s", p, mode=WriteMode.MERGE)
        assert store.session("s").chain_start_version == 7
        assert store.sweep(now_nanos=time.time_ns() + LATER).heads_folded == 0
        assert not _sealed_head(store, "s")


def _head_frame(config: StoreConfig, session: str, version: int, change: Callable[[bytearray], object]) -> None:
    """Apply ``change`` to the frame stored as ``session``'s ``version`` (its value after the metadata)."""
    with frames_table(config.data_dir) as (txn, frames):
        key = keys.frame_key(keys.session_key(session), version)
        stored = txn.get(key, db=frames)
        assert stored is not None
        value = bytearray(stored)
        (n,) = struct.unpack_from("<H", value)
        frame = value[2 + n :]
        change(frame)
        txn.put(key, bytes(value[: 2 + n] + frame), db=frames)


@pytest.mark.parametrize("where", [5, 20, -40, -1])  # header (version), header (checksum), payload, its end
def test_a_damaged_folded_head_is_data_loss_naming_its_version(config: StoreConfig, where: int) -> None:
    states = _write(config)
    head = len(states["b"])

    def flip(frame: bytearray) -> None:
        frame[where] ^= 0x10

    _head_frame(config, "b", head, flip)
    with Store(config) as store:
        with pytest.raises(DataLoss, match=f"session 'b'( version {head})?: "):
            store.get("b")
        assert store.get("a").state == states["a"][-1]  # the other sessions read on
        assert store.get("c").state == states["c"][-1]


def test_a_folded_head_over_max_state_bytes_is_refused(config: StoreConfig) -> None:
    states = _write(config)
    size = len(states["a"][-1])
    with Store(config) as store:
        with pytest.raises(StateTooLarge, match=f"session 'a' version {len(states['a'])}"):
            store.get("a", max_state_bytes=size - 1)
        assert store.get("a", max_state_bytes=size).state == states["a"][-1]


def test_a_folded_frame_under_another_versions_key_is_never_served_as_that_version(config: StoreConfig) -> None:
    states = _write(config)
    head = len(states["a"])
    with frames_table(config.data_dir) as (txn, frames):
        sid = keys.session_key("a")
        # The head's value, copied under the next version's key: the last key of the session, read first.
        stored = txn.get(keys.frame_key(sid, head), db=frames)
        assert stored is not None
        txn.put(keys.frame_key(sid, head + 1), stored, db=frames)
    refused = f"version {head + 1}: the frame stored there is version {head}'s"
    with Store(config, readonly=True) as store:
        with pytest.raises(DataLoss, match=refused):
            store.get("a")
        with pytest.raises(DataLoss, match=refused):  # nor by the sidecar's gRPC process
            headreads.read_head(store, "a")


def test_a_result_reads_its_info_once_when_asked_and_is_immutable() -> None:
    calls: list[int] = []
    info = object()

    def read_info() -> Any:
        calls.append(1)
        return info

    got = GetResult(3, b"state", read_info=read_info)
    assert calls == []
    assert got.info is info and got.info is info and calls == [1]
    with pytest.raises(FrozenInstanceError):
        got.state = b"other"
    with pytest.raises(TypeError, match="one of them"):
        GetResult(3, b"state")
    with pytest.raises(TypeError, match="one of them"):
        GetResult(3, b"state", info, read_info=read_info)
    assert GetResult(3, b"state", read_info=read_info) == GetResult(3, b"state", info)
    assert GetResult(3, b"state", read_info=read_info) != GetResult(4, b"state", info)


def test_the_grpc_process_reads_a_folded_head_in_one_step_and_advances_from_it(
    config: StoreConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """read_head (the sidecar's gRPC process's cold Get) takes the same step: no chain read, the same state
    and info as the chain read, and a reader that advances past the next writes as open_chain's would."""
    states = _write(config)
    asked = _counting_chain_reads(monkeypatch, headreads)
    with Store(config) as store:
        for session, expected in states.items():
            got, reader, _ = headreads.read_head(store, session, max_state_bytes=1 << 20, max_output_bytes=1 << 20)
            assert asked == []
            assert got == store.get(session, use_cache=False) and got.state == expected[-1]
            assert reader is not None and reader.version == len(expected) and reader.latest.state == expected[-1]
            patches = merge_patches(10 + len(session), steps=3)
            for p in patches:
                store.put(session, p, mode=WriteMode.MERGE)
            advanced = headreads.advance_head(store, session, reader)
            assert advanced is not None and advanced[0] == store.get(session, use_cache=False)
        # Past a bound, the chain read decides, and names it.
        with pytest.raises(StateTooLarge, match="version"):
            headreads.read_head(store, "a", max_output_bytes=10)
        assert asked == [0]
