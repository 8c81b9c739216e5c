"""Compare-and-set on the head's content through a real sidecar: every VersionInfo and PutResponse carries its
state's XXH3-64, and a write's expected_state_xxh3 lands only on that state."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import xxhash

from ckpt.sidecar.client import CheckpointClient, ConflictError, EventFilter, event
from ckpt.sidecar.server.replycache import INLINE_READ_MAX_OUTPUT_BYTES
from ckpt.v1 import checkpoint_pb2 as pb
from ckpt.v1 import service_pb2
from tests.client.support import FLAVOURS, LoseFirstReply, open_client
from tests.support import Sidecar, metric, start_sidecar_with_metrics, wait_for_metrics


def xxh3(state: bytes) -> int:
    return xxhash.xxh3_64_intdigest(state)


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    s = start_sidecar_with_metrics(tmp_path / "data")
    yield s
    assert s.stop() == 0, s.log()


def test_every_version_info_a_read_returns_carries_its_states_xxh3(sidecar: Sidecar) -> None:
    large = b"L" * (INLINE_READ_MAX_OUTPUT_BYTES + 8)
    with CheckpointClient(sidecar.unix_target) as c:
        for v in range(1, 4):
            put = c.put("r", b"state %d" % v)
            assert put.state_xxh3 == xxh3(b"state %d" % v)
        head = c.get("r")  # read by the gRPC process, which keeps the reply
        hit = c.get("r")  # the kept reply
        wait_for_metrics(lambda: metric(sidecar, "ckpt_reply_cache_hits_total", missing=0.0) == 1.0)
        assert head.info.state_xxh3 == hit.info.state_xxh3 == xxh3(b"state 3")
        old = c.get("r", 2)
        assert old.info.state_xxh3 == xxh3(b"state 2")
        with_events = c.get("r", events=EventFilter())
        assert with_events.info.state_xxh3 == xxh3(b"state 3")
        listed = list(c.history("r"))
        assert [i.state_xxh3 for i in listed] == [xxh3(b"state %d" % v) for v in (3, 2, 1)]
        assert [i.state_xxh3 for i in c.history("r", include_states=True)] == [i.state_xxh3 for i in listed]
        c.put("big", large)
        forwarded = c.get("big")  # too large to decode here: the store process reads it
        assert forwarded.info.state_xxh3 == xxh3(large)
        for step in range(1, 20):  # each patch overwrites step and goal: compaction drops what they replace
            patch = pb.Checkpoint(step=step, goal=f"goal {step} " + "g" * 200)
            merged = c.merge("typed", message=patch)
        typed = c.get("typed")
        assert len(typed.state) < 19 * 200  # compacted
        assert merged.state_xxh3 == typed.info.state_xxh3 == xxh3(typed.state)
        masked = c.get("typed", field_mask=("step",))  # the info is the whole version's
        assert masked.state != typed.state and masked.info.state_xxh3 == xxh3(typed.state)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_write_on_a_head_deleted_and_written_again_to_its_version_is_a_conflict(
    sidecar: Sidecar, flavour: str
) -> None:
    with open_client(flavour, sidecar.unix_target) as c:
        c.put("s", b"\x08\x01")
        mine = c.merge("s", b"\x10\x01")  # the head this writer holds: version 2
        c.delete("s")  # another writer starts the session over, up to the same version
        c.put("s", b"\x08\x07")
        theirs = c.merge("s", b"\x10\x07")
        assert (theirs.version, mine.version) == (2, 2) and theirs.state_xxh3 != mine.state_xxh3
        with pytest.raises(ConflictError) as info:
            c.merge("s", b"\x18\x01", expected_version=2, expected_state_xxh3=mine.state_xxh3)
        assert info.value.code == grpc.StatusCode.ABORTED and info.value.current_version == 2
        assert (
            f"session 's': expected_state_xxh3 {mine.state_xxh3:#018x} but the head, version 2, holds another state"
            in str(info.value)
        )
        assert c.get("s").state == b"\x08\x07\x10\x07"  # nothing written
        on_theirs = c.merge("s", b"\x18\x01", expected_version=2, expected_state_xxh3=theirs.state_xxh3)
        assert on_theirs.version == 3 and on_theirs.state_xxh3 == xxh3(b"\x08\x07\x10\x07\x18\x01")
        with pytest.raises(ConflictError) as none:
            c.put("absent", b"", expected_state_xxh3=0)
        assert none.value.current_version == 0
        with pytest.raises(ValueError, match="expected_state_xxh3 must be <= 18446744073709551615"):
            c.put("s", b"", expected_state_xxh3=2**64)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_retried_write_answers_the_state_xxh3_it_made(sidecar: Sidecar, flavour: str) -> None:
    lose = LoseFirstReply()
    with open_client(flavour, sidecar.unix_target) as c:
        head = c.put("s", b"\x08\x01").state_xxh3
    with open_client(flavour, sidecar.unix_target, interceptor=lose) as c:
        r = c.merge("s", b"\x10\x01", expected_state_xxh3=head)
    assert r.replayed and r.version == 2 and r.state_xxh3 == xxh3(b"\x08\x01\x10\x01")
    assert lose.sent[0] == lose.sent[1] and lose.sent[0].expected_state_xxh3 == head


def test_a_put_in_an_append_or_a_stream_is_checked_too(sidecar: Sidecar) -> None:
    with CheckpointClient(sidecar.unix_target) as c:
        head = c.put("s", b"\x08\x01").state_xxh3
        stale = service_pb2.PutRequest(state=b"\x08\x02", expected_state_xxh3=head ^ 1)
        with pytest.raises(ConflictError) as info:
            c.append_events("s", [event("note")], put=stale)
        assert info.value.current_version == 1
        fresh = service_pb2.PutRequest(state=b"\x08\x02", expected_state_xxh3=head)
        appended = c.append_events("s", [event("note")], put=fresh)
        assert appended.put.state_xxh3 == xxh3(b"\x08\x02")
        stale.session_id = fresh.session_id = "s"
        fresh.expected_state_xxh3 = appended.put.state_xxh3
        fresh.state = b"\x08\x03"
        results = list(c.put_stream([stale, fresh]))
        assert results[0].error.code == grpc.StatusCode.ABORTED.value[0] and results[0].error.current_version == 2
        assert "expected_state_xxh3" in results[0].error.message
        assert results[1].response.state_xxh3 == xxh3(b"\x08\x03")
