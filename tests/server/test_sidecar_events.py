"""The event log through a real sidecar: every field of AppendEvents and ReadEvents, and bad input."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from ckpt.v1 import service_pb2, service_pb2_grpc
from tests.support import Sidecar, ckpt, start_sidecar

SECOND = 1_000_000_000


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    s = start_sidecar(tmp_path_factory.mktemp("events") / "data", "--max-message-bytes", str(4 << 20))
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture
def stub(sidecar: Sidecar) -> Iterator[service_pb2_grpc.CheckpointServiceStub]:
    with grpc.insecure_channel(sidecar.unix_target) as channel:
        yield service_pb2_grpc.CheckpointServiceStub(channel)
    assert sidecar.process.poll() is None, sidecar.log()


def at(seconds: int) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(seconds * SECOND)
    return ts


def ev(type_: str, payload: bytes = b"", seconds: int | None = None, **attributes: str) -> service_pb2.Event:
    event = service_pb2.Event(type=type_, payload=payload, attributes=attributes)
    if seconds is not None:
        event.time.CopyFrom(at(seconds))
    return event


def code_of(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    err: Any = info.value
    return err.code(), err.details()


def read_all(stub: service_pb2_grpc.CheckpointServiceStub, **fields: Any) -> list[service_pb2.Event]:
    request = service_pb2.ReadEventsRequest(**fields)
    out: list[service_pb2.Event] = []
    while True:
        page = stub.ReadEvents(request, timeout=10)
        assert len(page.events) <= (request.page_size or 100)
        out += page.events
        if not page.next_page_token:
            return out
        request.page_token = page.next_page_token


def test_every_field_of_read_events(stub: service_pb2_grpc.CheckpointServiceStub) -> None:
    events = [ev("tool" if i % 3 == 0 else "msg", b"%d" % i, i, n=str(i)) for i in range(1, 601)]
    for start in range(0, 600, 200):
        reply = stub.AppendEvents(service_pb2.AppendEventsRequest(session_id="r", events=events[start : start + 200]))
        assert (reply.first_seq, reply.last_seq, reply.replayed) == (start + 1, start + 200, False)
        assert not reply.HasField("put")
    everything = read_all(stub, session_id="r")
    assert [e.seq for e in everything] == list(range(1, 601))
    first = everything[0]
    assert (first.type, first.payload, dict(first.attributes), first.time.ToSeconds()) == ("msg", b"1", {"n": "1"}, 1)
    assert [e.seq for e in read_all(stub, session_id="r", after_seq=590)] == list(range(591, 601))
    assert {e.type for e in read_all(stub, session_id="r", types=["tool"])} == {"tool"}
    assert len(read_all(stub, session_id="r", types=["tool", "msg"])) == 600
    window = read_all(stub, session_id="r", after=at(100), before=at(104))
    assert [e.seq for e in window] == [101, 102, 103]
    newest = stub.ReadEvents(service_pb2.ReadEventsRequest(session_id="r", newest_first=True, page_size=50))
    assert [e.seq for e in newest.events] == list(range(600, 550, -1)) and newest.next_page_token
    assert [e.seq for e in read_all(stub, session_id="r", newest_first=True, after_seq=595, page_size=2)] == [
        600,
        599,
        598,
        597,
        596,
    ]
    default_page = stub.ReadEvents(service_pb2.ReadEventsRequest(session_id="r"))
    assert len(default_page.events) == 100
    code, details = code_of(
        lambda: stub.ReadEvents(
            service_pb2.ReadEventsRequest(session_id="r", page_token=default_page.next_page_token, types=["msg"])
        )
    )
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "issued for another listing" in details


def test_append_with_a_put_a_conflict_and_a_replay(stub: service_pb2_grpc.CheckpointServiceStub) -> None:
    request = service_pb2.AppendEventsRequest(
        session_id="p",
        events=[ev("tool_call", b"{}")],
        request_id="req-1",
        put=service_pb2.PutRequest(state=b"\x08\x01", expected_version=0, request_id="ignored"),
    )
    reply = stub.AppendEvents(request)
    assert (reply.first_seq, reply.last_seq, reply.put.version, reply.replayed) == (1, 1, 1, False)
    again = stub.AppendEvents(request)
    assert again.replayed and again.put.replayed and (again.first_seq, again.put.version) == (1, 1)
    conflict = service_pb2.AppendEventsRequest(
        session_id="p", events=[ev("lost")], put=service_pb2.PutRequest(session_id="p", state=b"", expected_version=7)
    )
    with pytest.raises(grpc.RpcError) as info:
        stub.AppendEvents(conflict)
    err: Any = info.value
    assert err.code() is grpc.StatusCode.ABORTED and "expected_version 7 but the head is version 1" in err.details()
    assert ("ckpt-current-version", "1") in err.trailing_metadata()
    assert [e.type for e in read_all(stub, session_id="p")] == ["tool_call"]  # nothing appended
    assert stub.Get(service_pb2.GetRequest(session_id="p")).state == b"\x08\x01"
    reused = service_pb2.AppendEventsRequest(session_id="p", events=[ev("other")], request_id="req-1")
    code, details = code_of(lambda: stub.AppendEvents(reused))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "request_id 'req-1' was used for a different write" in details
    put_only = stub.AppendEvents(
        service_pb2.AppendEventsRequest(session_id="p", put=service_pb2.PutRequest(state=b"\x08\x02"))
    )
    assert (put_only.first_seq, put_only.last_seq, put_only.put.version) == (0, 0, 2)


def test_a_put_reusing_an_appends_request_id_on_a_session_of_events_alone_is_refused(
    stub: service_pb2_grpc.CheckpointServiceStub,
) -> None:
    append = service_pb2.AppendEventsRequest(session_id="rid-e", events=[ev("a"), ev("b")], request_id="r")
    assert (stub.AppendEvents(append, timeout=10).last_seq, stub.AppendEvents(append, timeout=10).replayed) == (2, True)
    code, details = code_of(
        lambda: stub.Put(service_pb2.PutRequest(session_id="rid-e", state=b"\x08\x01", request_id="r"), timeout=10)
    )
    assert code is grpc.StatusCode.INVALID_ARGUMENT, details
    assert "request_id 'r' was used for a different write to session 'rid-e' (it appended events seq 1..2)" in details
    code, _ = code_of(lambda: stub.Get(service_pb2.GetRequest(session_id="rid-e"), timeout=10))
    assert code is grpc.StatusCode.NOT_FOUND  # the put made nothing
    again = stub.AppendEvents(append, timeout=10)  # the acknowledged append's retry is still answered
    assert (again.first_seq, again.last_seq, again.replayed) == (1, 2, True)
    assert [e.seq for e in read_all(stub, session_id="rid-e")] == [1, 2]


def test_fork_copies_events_only_when_asked_and_delete_counts_them(
    stub: service_pb2_grpc.CheckpointServiceStub,
) -> None:
    stub.AppendEvents(
        service_pb2.AppendEventsRequest(
            session_id="f", events=[ev("a", seconds=5)] * 10, put=service_pb2.PutRequest(state=b"\x08\x01")
        )
    )
    stub.Fork(service_pb2.ForkRequest(session_id="f", new_session_id="f-plain"))
    assert read_all(stub, session_id="f-plain") == []
    stub.Fork(service_pb2.ForkRequest(session_id="f", new_session_id="f-copy", copy_events=True))
    assert read_all(stub, session_id="f-copy") == read_all(stub, session_id="f")
    deleted = stub.DeleteSession(service_pb2.DeleteSessionRequest(session_id="f-copy"))
    assert (deleted.deleted_versions, deleted.deleted_events) == (1, 10)
    stub.AppendEvents(service_pb2.AppendEventsRequest(session_id="only-events", events=[ev("a")] * 3))
    deleted = stub.DeleteSession(service_pb2.DeleteSessionRequest(session_id="only-events"))
    assert (deleted.deleted_versions, deleted.deleted_events) == (0, 3)
    for call in (
        lambda: stub.DeleteSession(service_pb2.DeleteSessionRequest(session_id="only-events")),
        lambda: stub.ReadEvents(service_pb2.ReadEventsRequest(session_id="only-events")),
    ):
        code, details = code_of(call)
        assert code is grpc.StatusCode.NOT_FOUND and "'only-events' does not exist" in details


@pytest.mark.parametrize(
    ("request_", "code", "part"),
    [
        (
            service_pb2.AppendEventsRequest(session_id="b", events=[ev("t")] * 1001),
            grpc.StatusCode.INVALID_ARGUMENT,
            "events has 1001 entries; the limit is 1000 events per append",
        ),
        (
            service_pb2.AppendEventsRequest(session_id="b", events=[ev("t", b"x" * (5 << 20))]),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "",
        ),
        (
            service_pb2.AppendEventsRequest(session_id="b", events=[ev("")]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "events[0].type is 0 bytes; it must be 1-128 bytes of UTF-8",
        ),
        (
            service_pb2.AppendEventsRequest(session_id="b", events=[ev("tab\there")]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "events[0].type 'tab\\there' contains an ASCII control character",
        ),
        (
            service_pb2.AppendEventsRequest(
                session_id="b", events=[service_pb2.Event(type="t", attributes={"k" * 64: "v"})]
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "events[0].attributes key",
        ),
        (
            service_pb2.AppendEventsRequest(
                session_id="b", events=[service_pb2.Event(type="t", time=Timestamp(seconds=1, nanos=-1))]
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "events[0].time (seconds=1, nanos=-1) is out of range",
        ),
        (
            service_pb2.AppendEventsRequest(
                session_id="b", events=[service_pb2.Event(type="t", time=Timestamp(seconds=-5))]
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "events[0].time (seconds=-5, nanos=0) is out of range: it must be a time from 1970-01-01T00:00:00Z to"
            " 2262-04-11T23:47:16.854775807Z",
        ),
        (
            service_pb2.AppendEventsRequest(
                session_id="b", events=[service_pb2.Event(type="t", time=Timestamp(seconds=253_402_300_799))]
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "events[0].time (seconds=253402300799, nanos=0) is out of range: it must be a time from"
            " 1970-01-01T00:00:00Z to 2262-04-11T23:47:16.854775807Z",
        ),
        (
            service_pb2.AppendEventsRequest(
                session_id="b", events=[service_pb2.Event(type="t", time=Timestamp(seconds=9_223_372_037))]
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "events[0].time (seconds=9223372037, nanos=0) is out of range: it must be a time from"
            " 1970-01-01T00:00:00Z to 2262-04-11T23:47:16.854775807Z",
        ),
        (
            service_pb2.AppendEventsRequest(session_id="b", put=service_pb2.PutRequest(session_id="c")),
            grpc.StatusCode.INVALID_ARGUMENT,
            "put.session_id 'c' is not the session appended to ('b')",
        ),
        (
            service_pb2.AppendEventsRequest(
                session_id="b", events=[ev("t")], put=service_pb2.PutRequest(state=b"x", labels={"": "v"})
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "put.labels key '' is 0 bytes; it must be 1-63",
        ),
        (
            service_pb2.AppendEventsRequest(session_id="b", events=[ev("t")], put=service_pb2.PutRequest(mode=7)),  # type: ignore[arg-type]
            grpc.StatusCode.INVALID_ARGUMENT,
            "put.mode 7 is not a WriteMode",
        ),
        (
            service_pb2.AppendEventsRequest(
                session_id="b",
                events=[ev("t")],
                put=service_pb2.PutRequest(state=b"\xff\xff", mode=service_pb2.WRITE_MODE_MERGE),
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "put.state is not a valid MERGE patch",
        ),
        (  # a patch this large is checked off the event loop
            service_pb2.AppendEventsRequest(
                session_id="b",
                events=[ev("t")],
                put=service_pb2.PutRequest(state=b"\x08\x01" * 10_000 + b"\xff", mode=service_pb2.WRITE_MODE_MERGE),
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "put.state is not a valid MERGE patch",
        ),
        (
            service_pb2.AppendEventsRequest(
                session_id="b", events=[ev("t")], put=service_pb2.PutRequest(message_type="no.Such")
            ),
            grpc.StatusCode.FAILED_PRECONDITION,
            "put.message_type 'no.Such' is not registered",
        ),
        (
            service_pb2.AppendEventsRequest(session_id="", events=[ev("t")]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "session_id is empty",
        ),
        (
            service_pb2.ReadEventsRequest(session_id="never-written"),
            grpc.StatusCode.NOT_FOUND,
            "session 'never-written' does not exist (it has neither events nor versions)",
        ),
        (
            service_pb2.ReadEventsRequest(session_id="b", page_size=1001),
            grpc.StatusCode.INVALID_ARGUMENT,
            "page_size must be in 0..1000",
        ),
        (
            service_pb2.ReadEventsRequest(session_id="b", after=at(10), before=at(5)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "is later than before",
        ),
        (
            service_pb2.ReadEventsRequest(session_id="b", page_token="not-a-token"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "page_token 'not-a-token' is not a token this server issued",
        ),
    ],
)
def test_bad_input_gets_a_precise_status_and_stores_nothing(
    stub: service_pb2_grpc.CheckpointServiceStub, request_: Any, code: grpc.StatusCode, part: str
) -> None:
    stub.AppendEvents(service_pb2.AppendEventsRequest(session_id="b", events=[ev("before")]))
    method = stub.AppendEvents if isinstance(request_, service_pb2.AppendEventsRequest) else stub.ReadEvents
    got, details = code_of(lambda: method(request_, timeout=10))
    assert got is code and part in details, details
    assert read_all(stub, session_id="b", newest_first=True, page_size=1)[0].type == "before"
    assert stub.DeleteSession(service_pb2.DeleteSessionRequest(session_id="b")).deleted_events == 1


def test_a_session_of_events_alone_is_listed_by_list_sessions_and_ckpt_sessions(
    sidecar: Sidecar, stub: service_pb2_grpc.CheckpointServiceStub
) -> None:
    stub.AppendEvents(service_pb2.AppendEventsRequest(session_id="listed-events-only", events=[ev("t")]), timeout=10)
    request = service_pb2.ListSessionsRequest(page_size=1)
    listed: dict[str, service_pb2.SessionInfo] = {}
    while True:
        page = stub.ListSessions(request, timeout=10)
        listed.update((s.session_id, s) for s in page.sessions)
        if not page.next_page_token:
            break
        request.page_token = page.next_page_token
    info = listed["listed-events-only"]
    assert (info.head_version, info.version_count) == (0, 0)
    assert 0 < info.created_at.ToNanoseconds() <= info.updated_at.ToNanoseconds()
    done = ckpt("sessions", "--target", sidecar.unix_target)
    assert done.returncode == 0, done.stderr
    assert "listed-events-only" in [json.loads(line)["session_id"] for line in done.stdout.decode().splitlines()]
