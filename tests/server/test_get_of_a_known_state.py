"""A Get naming a state the caller holds (GetRequest.known_state_xxh3), through a real sidecar: the reply
leaves the state out when the version read has that state, and is a whole Get's otherwise; the same
whichever process answers (the gRPC process, or the store process when the events asked with it are past
what the gRPC process reads), and a reply without its state is never kept as a Get's."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ckpt.codec import ChainPolicy, FrameKind
from ckpt.sidecar import Store, StoreConfig, WriteMode
from ckpt.sidecar.server.inlineevents import INLINE_EVENTS_BOUND
from ckpt.sidecar.store import read_info
from ckpt.v1 import checkpoint_pb2, service_pb2, service_pb2_grpc
from tests.store.support import merge_patches
from tests.support import Sidecar, checkpoint_stub, metered_sidecar, start_sidecar

#: More events than a page read in the gRPC process may hold.
MANY = INLINE_EVENTS_BOUND.max_events + 30


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    with metered_sidecar(tmp_path_factory.mktemp("known-state") / "data") as s:
        yield s


@pytest.fixture(scope="module")
def stub(sidecar: Sidecar) -> Iterator[service_pb2_grpc.CheckpointServiceStub]:
    with checkpoint_stub(sidecar.unix_target) as stub:
        yield stub


def _get(stub: service_pb2_grpc.CheckpointServiceStub, sid: str, **fields: Any) -> service_pb2.GetResponse:
    reply: service_pb2.GetResponse = stub.Get(service_pb2.GetRequest(session_id=sid, **fields), timeout=10)
    return reply


def _without_state(reply: service_pb2.GetResponse) -> service_pb2.GetResponse:
    """``reply`` as one leaving its state out would be."""
    out = service_pb2.GetResponse()
    out.CopyFrom(reply)
    out.ClearField("state")
    out.state_omitted = True
    return out


def test_the_state_held_is_left_out_and_any_other_sent_whole(stub: service_pb2_grpc.CheckpointServiceStub) -> None:
    first = stub.Put(service_pb2.PutRequest(session_id="s", state=b"\x0a\x05first" * 400), timeout=10)
    whole = _get(stub, "s")
    for _ in range(2):  # the second with the whole reply kept by the gRPC process
        known = _get(stub, "s", known_state_xxh3=first.state_xxh3)
        assert known == _without_state(whole) and known.state == b"" and known.info.state_xxh3 == first.state_xxh3
    assert _get(stub, "s", known_state_xxh3=first.state_xxh3 ^ 1) == whole  # a state not held: sent

    second = stub.Put(service_pb2.PutRequest(session_id="s", state=b"\x0a\x06second" * 400), timeout=10)
    moved = _get(stub, "s", known_state_xxh3=first.state_xxh3)  # the head moved: the new state, whole
    assert not moved.state_omitted and moved.version == 2 and moved.state == b"\x0a\x06second" * 400
    assert moved.info.state_xxh3 == second.state_xxh3
    # An older version asked by number is compared with its own state.
    assert _get(stub, "s", version=1, known_state_xxh3=first.state_xxh3) == _without_state(_get(stub, "s", version=1))
    assert _get(stub, "s", version=1, known_state_xxh3=second.state_xxh3).state == b"\x0a\x05first" * 400
    # Unset, the state is always sent, even when it is the one held (0 is a hash like any other).
    assert _get(stub, "s") == _get(stub, "s", version=2)


def test_a_new_version_with_the_same_state_answers_its_own_number(
    stub: service_pb2_grpc.CheckpointServiceStub,
) -> None:
    put = stub.Put(service_pb2.PutRequest(session_id="same", state=b"\x0a\x01x"), timeout=10)
    stub.Put(service_pb2.PutRequest(session_id="same", state=b"\x0a\x01x"), timeout=10)
    reply = _get(stub, "same", known_state_xxh3=put.state_xxh3)
    assert reply.state_omitted and reply.version == 2 and reply.info.version == 2


def test_events_come_as_they_would_with_the_state(stub: service_pb2_grpc.CheckpointServiceStub) -> None:
    events = [service_pb2.Event(type="writes" if i % 2 else "msg", payload=b"e%d" % i) for i in range(8)]
    done = stub.AppendEvents(
        service_pb2.AppendEventsRequest(session_id="ev", events=events, put=service_pb2.PutRequest(state=b"\x0a\x01e"))
    )
    read = service_pb2.ReadEventsRequest(types=["writes"], after_seq=2)
    whole = _get(stub, "ev", events=read)
    known = _get(stub, "ev", events=read, known_state_xxh3=done.put.state_xxh3)
    assert known == _without_state(whole)
    assert [e.seq for e in known.events.events] == [4, 6, 8]


def test_the_store_process_leaves_it_out_too_and_the_grpc_process_keeps_no_such_reply(
    stub: service_pb2_grpc.CheckpointServiceStub,
) -> None:
    events = [service_pb2.Event(type="msg", payload=b"p%d" % i) for i in range(MANY)]
    state = b"\x0a\x04long" * 100
    done = stub.AppendEvents(
        service_pb2.AppendEventsRequest(session_id="long", events=events, put=service_pb2.PutRequest(state=state))
    )
    # A page past what the gRPC process reads: the Get goes to the store process.
    read = service_pb2.ReadEventsRequest(page_size=1000)
    known = _get(stub, "long", events=read, known_state_xxh3=done.put.state_xxh3)
    assert known.state_omitted and known.state == b"" and len(known.events.events) == MANY
    for _ in range(2):  # had the gRPC process kept the reply above, these would answer an empty state
        plain = _get(stub, "long")
        assert not plain.state_omitted and plain.state == state
    assert known == _without_state(_get(stub, "long", events=read))


def test_refusals_are_a_gets(stub: service_pb2_grpc.CheckpointServiceStub) -> None:
    typed = checkpoint_pb2.Checkpoint(goal="g", handoff=checkpoint_pb2.Handoff(next="n"))
    put = stub.Put(
        service_pb2.PutRequest(session_id="typed", state=typed.SerializeToString(), message_type="ckpt.v1.Checkpoint"),
        timeout=10,
    )
    request = service_pb2.GetRequest(session_id="typed", known_state_xxh3=put.state_xxh3)
    request.field_mask.paths.append("handoff")
    for _ in range(2):  # the second with a masked reply kept, had one been
        with pytest.raises(grpc.RpcError) as info:
            stub.Get(request, timeout=10)
        err: Any = info.value
        assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "known_state_xxh3 cannot be combined with field_mask" in err.details()
    for sid, version, code in (("nobody", 0, grpc.StatusCode.NOT_FOUND), ("typed", 9, grpc.StatusCode.NOT_FOUND)):
        with pytest.raises(grpc.RpcError) as info:
            _get(stub, sid, version=version, known_state_xxh3=1)
        err = info.value
        assert err.code() is code, err.details()
        with pytest.raises(grpc.RpcError) as without:
            _get(stub, sid, version=version)
        plain: Any = without.value
        assert err.details() == plain.details()


def test_read_info_is_what_a_get_says_of_every_stored_version(tmp_path: Path) -> None:
    """Every kind of frame a session stores (FULL, DELTA, MERGE patches, a folded run's PREFIX frames and
    its sealed head), read without its state, says what a Get of it says."""
    config = StoreConfig(
        data_dir=tmp_path / "data",
        sweep_interval_seconds=3600,
        chain_policy=ChainPolicy(max_depth=8, max_decode_cost_ratio=1000.0),
    )
    patches = merge_patches(30, steps=12)
    with Store(config) as store:
        for i in range(30):
            store.put("replace", b"\x0a\x10" + b"%016d" % i + b"tail" * (i % 7))
        for p in patches:
            store.put("open", p, mode=WriteMode.MERGE)
            store.put("folded", p, mode=WriteMode.MERGE)
        store.close()  # folds the heads written: the later puts to "open" leave it unfolded
    with Store(config) as store:
        for p in merge_patches(31, steps=5):
            store.put("open", p, mode=WriteMode.MERGE)
        seen = set()
        for sid in ("replace", "open", "folded"):
            head = store.get(sid, use_cache=False).info
            assert read_info(store, sid) == (head, None)
            for version in range(1, head.version + 1):
                info, page = read_info(store, sid, version)
                assert info == store.get(sid, version, use_cache=False).info and page is None
                seen.add(info.frame_kind)
        assert seen == {FrameKind.FULL, FrameKind.DELTA, FrameKind.PATCH, FrameKind.PREFIX}


def test_without_a_reply_cache_the_grpc_process_leaves_it_out_too(tmp_path: Path) -> None:
    sidecar = start_sidecar(tmp_path / "data", "--reply-cache-bytes", "0")
    try:
        with grpc.insecure_channel(sidecar.unix_target) as channel:
            stub = service_pb2_grpc.CheckpointServiceStub(channel)
            put = stub.Put(service_pb2.PutRequest(session_id="s", state=b"\x0a\x03abc" * 50), timeout=10)
            whole = _get(stub, "s")
            assert _get(stub, "s", known_state_xxh3=put.state_xxh3) == _without_state(whole)
            assert _get(stub, "s", known_state_xxh3=put.state_xxh3 ^ 1) == whole
            request = service_pb2.GetRequest(session_id="s", known_state_xxh3=put.state_xxh3)
            request.field_mask.paths.append("handoff")
            with pytest.raises(grpc.RpcError) as info:
                stub.Get(request, timeout=10)
            err: Any = info.value
            assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "known_state_xxh3 cannot be combined with field_mask" in err.details()
    finally:
        assert sidecar.stop() == 0, sidecar.log()


def test_the_state_as_written_is_still_held_once_a_quiet_fold_compacts_it(tmp_path: Path) -> None:
    """A fold rewrites a quiet head compacted (the same message in other bytes, another XXH3-64): a caller
    naming the state_xxh3 its put answered was sent the whole state, and the docs' own example then took it
    for another writer's head."""
    sidecar = start_sidecar(tmp_path / "data", "--fold-after-quiet-seconds", "1", "--sweep-interval-seconds", "1")
    try:
        with grpc.insecure_channel(sidecar.unix_target) as channel:
            stub = service_pb2_grpc.CheckpointServiceStub(channel)
            put = None
            for n in range(30):  # each overwrites the last goal: a fold drops them
                state = checkpoint_pb2.Checkpoint(goal=f"goal {n}").SerializeToString()
                mode = service_pb2.WRITE_MODE_MERGE if n else service_pb2.WRITE_MODE_REPLACE
                request = service_pb2.PutRequest(
                    session_id="s", state=state, mode=mode, message_type="ckpt.v1.Checkpoint"
                )
                put = stub.Put(request, timeout=10)
            assert put is not None
            deadline = time.monotonic() + 30
            while (head := _get(stub, "s")).info.state_xxh3 == put.state_xxh3:
                assert time.monotonic() < deadline, "the head was never folded"
                time.sleep(0.2)
            assert head.version == put.version and len(head.state) == len(state)
            known = _get(stub, "s", known_state_xxh3=put.state_xxh3)
            assert known == _without_state(head)
            assert checkpoint_pb2.Checkpoint.FromString(head.state).goal == "goal 29"
    finally:
        assert sidecar.stop() == 0, sidecar.log()
