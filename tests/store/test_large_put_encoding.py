"""A large put's frame is encoded on its caller's thread, and the writer stores it if the head has not moved.

A REPLACE of ENCODE_AHEAD_BYTES or more, and a MERGE whose frame starts a
chain of a state that large, are encoded before they are queued; a write of
the same session committed meanwhile makes the writer encode the put itself.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt.codec import ChainEncoder, ChainPolicy, FrameKind
from ckpt.sidecar import PutRequest, Store, StoreConfig, VersionConflict, WriteMode
from ckpt.sidecar.store import ENCODE_AHEAD_BYTES
from ckpt.v1 import checkpoint_pb2 as pb
from tests.store.support import EncodingGate, gate_installed, put_later

#: Chains of at most 2 frames after their FULL one: the third MERGE onto a head starts a chain.
SHORT_CHAINS = ChainPolicy(max_depth=2)


def large_state(seed: int) -> bytes:
    """ENCODE_AHEAD_BYTES and more of fields 2 (a well-formed MERGE patch too) of random letters."""
    letters = random.Random(seed).randbytes(ENCODE_AHEAD_BYTES + 64_000).translate((bytes(range(97, 123)) * 10)[:256])
    pieces = [letters[i : i + 16_000] for i in range(0, len(letters), 16_000)]
    return b"".join(b"\x12" + bytes([(len(p) & 0x7F) | 0x80, len(p) >> 7]) + p for p in pieces)


def patch(n: int) -> bytes:
    return pb.Checkpoint(step=n, messages=[pb.Message(content=f"patch {n}")]).SerializeToString()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(StoreConfig(data_dir=tmp_path / "data", chain_policy=SHORT_CHAINS)) as s:
        yield s


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[EncodingGate]:
    with gate_installed(monkeypatch, ENCODE_AHEAD_BYTES, merges=True) as g:
        yield g


def test_another_sessions_put_commits_while_a_large_replace_is_encoded_on_its_callers_thread(
    store: Store, gate: EncodingGate
) -> None:
    store.put("big", large_state(1))
    gate.armed = True
    newer = large_state(2)
    put = put_later(store, PutRequest("big", newer))
    assert gate.entered.wait(30)
    # The large put's encoding is blocked, and not in the writer: another session's put commits meanwhile.
    other = put_later(store, PutRequest("other", b"small"))
    try:
        assert other.result(timeout=10).version == 1
    finally:
        gate.release.set()
    assert gate.thread is not None and gate.thread.name != "ckpt-writer"
    assert put.result(timeout=30).version == 2
    assert store.get("big").state == newer
    assert ("replace", "ckpt-writer") not in gate.large  # the writer only stored the frame


def test_a_merge_starting_a_chain_onto_a_large_head_is_encoded_on_its_callers_thread(
    store: Store, gate: EncodingGate
) -> None:
    head = large_state(1)
    store.put("big", head)
    for n in (1, 2):  # PATCH frames, encoded by the writer
        assert store.put("big", patch(n), mode=WriteMode.MERGE).frame_kind is FrameKind.PATCH
    gate.armed = True
    put = put_later(store, PutRequest("big", patch(3), mode=WriteMode.MERGE))
    assert gate.entered.wait(30)
    other = put_later(store, PutRequest("other", b"small"))
    try:
        assert other.result(timeout=10).version == 1
    finally:
        gate.release.set()
    assert gate.thread is not None and gate.thread.name != "ckpt-writer"
    result = put.result(timeout=30)
    assert (result.version, result.frame_kind) == (4, FrameKind.FULL)
    assert store.get("big").state == head + patch(1) + patch(2) + patch(3)
    # The next write continues the encoder the caller made (its stream started by the FULL frame).
    assert store.put("big", patch(4), mode=WriteMode.MERGE).frame_kind is FrameKind.PATCH
    assert store.get("big").state == head + b"".join(patch(n) for n in range(1, 5))
    assert [store.get("big", v).state for v in (3, 4)] == [
        head + patch(1) + patch(2),
        head + patch(1) + patch(2) + patch(3),
    ]


def test_a_large_replace_lands_on_a_write_of_its_session_committed_during_its_encoding(
    store: Store, gate: EncodingGate
) -> None:
    first = large_state(1)
    store.put("big", first)
    gate.armed = True
    newer = large_state(2)
    put = put_later(store, PutRequest("big", newer))
    assert gate.entered.wait(30)
    assert store.put("big", patch(1), mode=WriteMode.MERGE).version == 2  # the head moves on
    gate.release.set()
    assert put.result(timeout=30).version == 3
    # Encoded against version 1, the frame is not stored: its commit encoded the put again, onto version 2
    # (on the putting thread, the writer being idle then, or on the writer's).
    assert [kind for kind, _ in gate.large[1:]].count("replace") == 2
    assert [store.get("big", v).state for v in (1, 2, 3)] == [first, first + patch(1), newer]
    assert store.put("big", patch(2), mode=WriteMode.MERGE).version == 4
    assert store.get("big").state == newer + patch(2)


def test_a_merge_starting_a_chain_lands_on_a_write_of_its_session_committed_during_its_encoding(
    store: Store, gate: EncodingGate
) -> None:
    head = large_state(1)
    store.put("big", head)
    for n in (1, 2):
        store.put("big", patch(n), mode=WriteMode.MERGE)
    gate.armed = True
    put = put_later(store, PutRequest("big", patch(3), mode=WriteMode.MERGE))
    assert gate.entered.wait(30)
    # This one starts the chain (encoded on this thread, the gate taken); the put held starts none now.
    assert store.put("big", patch(9), mode=WriteMode.MERGE).frame_kind is FrameKind.FULL
    gate.release.set()
    result = put.result(timeout=30)
    assert (result.version, result.frame_kind) == (5, FrameKind.PATCH)
    assert store.get("big").state == head + patch(1) + patch(2) + patch(9) + patch(3)


def test_a_large_put_expecting_the_head_it_was_encoded_against_conflicts_once_the_head_moved(
    store: Store, gate: EncodingGate
) -> None:
    first = large_state(1)
    store.put("big", first)
    gate.armed = True
    put = put_later(store, PutRequest("big", large_state(2), expected_version=1))
    assert gate.entered.wait(30)
    store.put("big", patch(1), mode=WriteMode.MERGE)
    gate.release.set()
    with pytest.raises(VersionConflict):
        put.result(timeout=30)
    assert store.get("big").state == first + patch(1)


def test_a_large_put_of_a_new_session_and_its_retry_by_request_id(store: Store, gate: EncodingGate) -> None:
    state = large_state(3)
    done = store.put("new", state, request_id="r1")
    assert (done.version, done.frame_kind) == (1, FrameKind.FULL)
    again = store.put("new", state, request_id="r1")  # encoded ahead again, then answered as the first
    assert again.version == 1 and again.replayed
    assert gate.large == [("replace", "MainThread")] * 2  # never by the writer
    assert store.get("new").state == state
    assert store.list_versions("new")[0][-1].version == 1


def test_a_sessions_write_after_a_full_frame_too_large_to_cache_with_its_stream_reads_no_chain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    resumed: list[str] = []
    resume = ChainEncoder.resume.__func__  # type: ignore[attr-defined]

    def counted(cls: type[ChainEncoder], *args: Any, **kwargs: Any) -> ChainEncoder:
        resumed.append(threading.current_thread().name)
        return resume(cls, *args, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(ChainEncoder, "resume", classmethod(counted))
    # A FULL frame's stream opens a window twice its state's size: with it, the encoder passes this budget.
    config = StoreConfig(data_dir=tmp_path / "data", encoder_cache_bytes=2 * ENCODE_AHEAD_BYTES)
    with Store(config) as store:
        head = large_state(1)
        assert store.put("big", head).frame_kind is FrameKind.FULL
        assert store.put("big", patch(1), mode=WriteMode.MERGE).frame_kind is FrameKind.PATCH
        assert store.put("big", patch(2), mode=WriteMode.MERGE).frame_kind is FrameKind.PATCH
        assert "ckpt-writer" not in resumed  # kept without its stream: the writer read no chain back
        assert store.get("big").state == head + patch(1) + patch(2)


def test_a_typed_sessions_merge_starting_a_chain_is_compacted_as_the_writer_would(
    store: Store, gate: EncodingGate
) -> None:
    typed = "ckpt.v1.Checkpoint"
    head = pb.Checkpoint(goal="g" * 200_000, messages=[pb.Message(content="m" * ENCODE_AHEAD_BYTES)])
    store.put("big", head.SerializeToString(), message_type=typed)
    merged = pb.Checkpoint()
    merged.CopyFrom(head)
    patches = [pb.Checkpoint(goal=str(n) * 200_000) for n in range(3)]
    for p in patches[:2]:
        assert store.put("big", p.SerializeToString(), mode=WriteMode.MERGE).frame_kind is FrameKind.PATCH
    gate.armed = True
    put = put_later(store, PutRequest("big", patches[2].SerializeToString(), mode=WriteMode.MERGE))
    assert gate.entered.wait(30)
    gate.release.set()
    assert put.result(timeout=30).frame_kind is FrameKind.FULL
    assert gate.thread is not None and gate.thread.name != "ckpt-writer"
    for p in patches:
        merged.MergeFrom(p)
    got = store.get("big")
    # The goals the last one overwrote are gone from the chain's new FULL frame: the state is compacted.
    assert got.state == merged.SerializeToString()
    assert got.info.message_type == typed
