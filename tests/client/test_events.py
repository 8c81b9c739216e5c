"""The clients' event methods against a real sidecar: append_events (with a put, retried by request id) and events."""

from __future__ import annotations

import asyncio
import datetime

import pytest

from ckpt.sidecar.client import (
    AsyncCheckpointClient,
    CheckpointClient,
    ConflictError,
    EventConflictError,
    NotFoundError,
    event,
)
from ckpt.v1 import service_pb2
from tests.support import Sidecar

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def test_sync_append_with_a_put_then_read_every_way(sidecar: Sidecar) -> None:
    with CheckpointClient(sidecar.unix_target) as c:
        steps = [
            event("tool" if i % 2 else "msg", b"%d" % i, time=T0 + datetime.timedelta(seconds=i)) for i in range(250)
        ]
        reply = c.append_events("s", steps, put=service_pb2.PutRequest(state=b"\x08\x01"), request_id="first")
        assert (reply.first_seq, reply.last_seq, reply.log_last_seq, reply.put.version) == (1, 250, 250, 1)
        put = c.append_events("s", [], put=service_pb2.PutRequest(state=b"\x08\x02", expected_version=1))
        assert (put.first_seq, put.last_seq, put.log_last_seq, put.put.version) == (0, 0, 250, 2)
        again = c.append_events("s", steps, put=service_pb2.PutRequest(state=b"\x08\x01"), request_id="first")
        assert again.replayed and again.last_seq == 250
        assert [e.seq for e in c.events("s", page_size=7)] == list(range(1, 251))  # pages followed
        assert [e.seq for e in c.events("s", after_seq=245, newest_first=True)] == [250, 249, 248, 247, 246]
        tools = list(c.events("s", types=("tool",), after=T0 + datetime.timedelta(seconds=10)))
        assert [e.payload for e in tools][:3] == [b"11", b"13", b"15"] and {e.type for e in tools} == {"tool"}
        window = c.events("s", after=T0, before=T0 + datetime.timedelta(seconds=3))
        assert [e.payload for e in window] == [b"1", b"2"]
        with pytest.raises(ConflictError):
            c.append_events("s", [event("lost")], put=service_pb2.PutRequest(state=b"", expected_version=9))
        assert next(iter(c.events("s", newest_first=True))).seq == 250
        with pytest.raises(NotFoundError):
            list(c.events("nobody"))
        forked = c.fork("s", "s2", copy_events=True)
        assert forked.head_version == 1 and len(list(c.events("s2", page_size=1000))) == 250
        assert c.delete("s2") == 1
        # The generated request id is sent again unchanged on a retry; two calls are two appends.
        assert c.append_events("s", [event("x")]).first_seq == 251
        assert c.append_events("s", [event("x")]).first_seq == 252


def test_async_client_appends_and_iterates(sidecar: Sidecar) -> None:
    async def run() -> None:
        async with AsyncCheckpointClient(sidecar.unix_target) as c:
            reply = await c.append_events("a", [event("step", attributes={"k": "v"})] * 3)
            assert (reply.first_seq, reply.last_seq) == (1, 3)
            replies = await asyncio.gather(*(c.append_events("a", [event("step")]) for _ in range(20)))
            assert sorted(r.first_seq for r in replies) == list(range(4, 24))  # dense under concurrent appends
            seen = [e async for e in c.events("a", page_size=5)]
            assert [e.seq for e in seen] == list(range(1, 24)) and dict(seen[0].attributes) == {"k": "v"}
            newest = [e.seq async for e in c.events("a", newest_first=True, after_seq=21)]
            assert newest == [23, 22]

    asyncio.run(run())


def test_arguments_are_refused_before_anything_is_sent(sidecar: Sidecar) -> None:
    with CheckpointClient(sidecar.unix_target) as c:
        with pytest.raises(TypeError, match=r"events\[0\] must be a ckpt\.v1\.Event"):
            c.append_events("s", ["not an event"])  # type: ignore[list-item]
        with pytest.raises(TypeError, match=r"events must be an iterable of ckpt\.v1\.Event"):
            c.append_events("s", b"bytes")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="events has 1001 entries"):
            c.append_events("s", [event("t")] * 1001)
        with pytest.raises(TypeError, match=r"put must be a ckpt\.v1\.PutRequest"):
            c.append_events("s", [], put=b"state")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="types must be an iterable of str, not a str"):
            c.events("s", types="tool")
        with pytest.raises(ValueError, match="page_size must be <= 1000"):
            c.events("s", page_size=5000)
        with pytest.raises(ValueError, match="time must be timezone-aware"):
            event("t", time=datetime.datetime(2026, 1, 1))
        with pytest.raises(TypeError, match="payload must be bytes"):
            event("t", "text")  # type: ignore[arg-type]


def test_an_append_on_another_last_seq_is_an_event_conflict_and_writes_nothing(sidecar: Sidecar) -> None:
    with CheckpointClient(sidecar.unix_target) as c:
        assert c.append_events("tail", [event("a")], expected_last_seq=0).first_seq == 1
        with pytest.raises(EventConflictError, match="expected_last_seq 0 but the event log's last seq is 1") as caught:
            c.append_events("tail", [event("b")], put=service_pb2.PutRequest(state=b"\x08\x01"), expected_last_seq=0)
        assert caught.value.last_seq == 1 and isinstance(caught.value, ConflictError)
        assert [e.type for e in c.events("tail")] == ["a"]
        with pytest.raises(NotFoundError):
            c.get("tail")  # the put went with the refused events
        assert c.append_events("tail", [event("b")], expected_last_seq=1).first_seq == 2
        with pytest.raises(ValueError, match="expected_last_seq"):
            c.append_events("tail", [event("c")], expected_last_seq=-1)


EAST, WEST = (datetime.timezone(datetime.timedelta(hours=h)) for h in (1, -1))
EVENT_RANGE = "it must be a time from 1970-01-01T00:00:00Z to 2262-04-11T23:47:16.854775807Z"
FILTER_RANGE = "it must be a time from 0001-01-01T00:00:00Z to 2554-07-21T23:34:33.709551615Z"
# Before year 1 and after year 9999 in UTC: converting them was an OverflowError.
YEAR_1_EAST = datetime.datetime(1, 1, 1, tzinfo=EAST)
YEAR_9999_WEST = datetime.datetime(9999, 12, 31, 23, 59, 59, tzinfo=WEST)


@pytest.mark.parametrize(
    "when",
    [
        YEAR_1_EAST,
        YEAR_9999_WEST,
        datetime.datetime(2300, 1, 1, tzinfo=datetime.UTC),
        datetime.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=datetime.UTC),
    ],
    ids=["year-1-east", "year-9999-west", "year-2300", "before-1970"],
)
def test_an_event_time_the_sidecar_cannot_hold_is_a_value_error_naming_the_times_it_can(
    when: datetime.datetime,
) -> None:
    with pytest.raises(ValueError) as caught:
        event("t", time=when)
    assert str(caught.value) == f"time {when.isoformat()} is out of range: {EVENT_RANGE}"


@pytest.mark.parametrize("when", [YEAR_1_EAST, YEAR_9999_WEST], ids=["year-1-east", "year-9999-west"])
def test_a_time_filter_the_sidecar_cannot_hold_is_a_value_error_naming_the_times_it_can(
    sidecar: Sidecar, when: datetime.datetime
) -> None:
    with CheckpointClient(sidecar.unix_target) as c:
        with pytest.raises(ValueError) as after:
            list(c.events("s", after=when))
        with pytest.raises(ValueError) as before:
            list(c.events("s", before=when))
        with pytest.raises(ValueError) as updated_after:
            list(c.sessions(updated_after=when))
        with pytest.raises(ValueError) as updated_before:
            list(c.sessions(updated_before=when))
    for name, caught in [
        ("after", after),
        ("before", before),
        ("updated_after", updated_after),
        ("updated_before", updated_before),
    ]:
        assert str(caught.value) == f"{name} {when.isoformat()} is out of range: {FILTER_RANGE}"
