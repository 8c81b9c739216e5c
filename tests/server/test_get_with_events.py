"""A Get that also reads events (GetRequest.events) through a real sidecar: the reply equals a Get and a
ReadEvents of the same data, whichever way the gRPC process answers it (its reply cache, its own read,
or forwarded to the store process), and the metrics tell which way it went."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckpt.sidecar.config import StoreConfig
from ckpt.sidecar.server.convert import version_info_pb
from ckpt.sidecar.server.eventconvert import event_query, read_response_pb
from ckpt.sidecar.server.getevents import events_part, state_part
from ckpt.sidecar.server.inlineevents import INLINE_EVENTS_BOUND
from ckpt.sidecar.server.replycache import INLINE_READ_MAX_OUTPUT_BYTES
from ckpt.sidecar.server.storelink import SERVED_REPORT_SECONDS
from ckpt.sidecar.store import EventPage
from ckpt.sidecar.store.engine import Store
from ckpt.store.v1 import records_pb2
from ckpt.v1 import checkpoint_pb2, service_pb2, service_pb2_grpc
from tests.support import Sidecar, checkpoint_stub, metered_sidecar, metric, metrics_text

GETS = 'ckpt_requests_total{rpc="Get"}'
READS = 'ckpt_requests_total{rpc="ReadEvents"}'
READ_HERE = 'ckpt_read_by_grpc_process_total{rpc="Get"}'
HITS = "ckpt_reply_cache_hits_total"
#: More events than a page read in the gRPC process may hold.
MANY = INLINE_EVENTS_BOUND.max_events + 30
TYPED = checkpoint_pb2.Checkpoint(
    goal="ship it", conversation_summary="s" * 3000, handoff=checkpoint_pb2.Handoff(next="ship")
)


def _events(n: int, kind: str = "msg") -> list[service_pb2.Event]:
    return [service_pb2.Event(type=("writes" if i % 3 == 0 else kind), payload=b"e%d" % i) for i in range(n)]


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    with metered_sidecar(tmp_path_factory.mktemp("get-events") / "data") as s:
        yield s


@pytest.fixture(scope="module")
def stub(sidecar: Sidecar) -> Iterator[service_pb2_grpc.CheckpointServiceStub]:
    with checkpoint_stub(sidecar.unix_target) as stub:
        yield stub


@pytest.fixture(scope="module")
def embedded(sidecar: Sidecar) -> Iterator[Store]:
    store = Store(StoreConfig(data_dir=sidecar.data_dir), readonly=True)
    yield store
    store.close()


def _sample(sidecar: Sidecar, name: str) -> float:
    return metric(sidecar, name) if f"\n{name} " in metrics_text(sidecar) else 0.0


def _counted(sidecar: Sidecar, call: Any) -> tuple[Any, dict[str, float]]:
    """``call()``'s answer, and how the metrics moved: every Get counted once, read here or not."""
    names = (GETS, READS, READ_HERE, HITS)
    time.sleep(4 * SERVED_REPORT_SECONDS)  # calls made before this one are reported by now
    before = {n: _sample(sidecar, n) for n in names}
    answer = call()
    deadline = time.monotonic() + 5
    while _sample(sidecar, GETS) == before[GETS]:  # a call answered here is reported a moment later
        assert time.monotonic() < deadline, "timed out waiting for the metrics"
        time.sleep(0.02)
    return answer, {n: _sample(sidecar, n) - before[n] for n in names}


def _expected(store: Store, request: service_pb2.GetRequest) -> service_pb2.GetResponse:
    """A Get and a ReadEvents of the same request, read in this process."""
    got = store.get(request.session_id, request.version)
    reply = service_pb2.GetResponse(version=got.version, state=got.state, message_type=got.info.message_type)
    reply.info.CopyFrom(version_info_pb(got.info))
    page = store.read_events(request.session_id, event_query(request.events), max_page_bytes=0)
    reply.events.CopyFrom(read_response_pb(page))
    return reply


def _get(stub: service_pb2_grpc.CheckpointServiceStub, sid: str, **events: Any) -> service_pb2.GetResponse:
    reply: service_pb2.GetResponse = stub.Get(
        service_pb2.GetRequest(session_id=sid, events=service_pb2.ReadEventsRequest(**events)), timeout=10
    )
    return reply


def test_a_cold_then_a_repeated_get_are_read_and_answered_in_the_grpc_process(
    sidecar: Sidecar, stub: service_pb2_grpc.CheckpointServiceStub, embedded: Store
) -> None:
    stub.AppendEvents(
        service_pb2.AppendEventsRequest(
            session_id="small", events=_events(10), put=service_pb2.PutRequest(state=b"\x0a\x03abc")
        )
    )
    request = service_pb2.GetRequest(session_id="small", events=service_pb2.ReadEventsRequest(types=["writes"]))
    cold, moved = _counted(sidecar, lambda: stub.Get(request, timeout=10))
    assert moved == {GETS: 1, READS: 0, READ_HERE: 1, HITS: 0}
    assert cold == _expected(embedded, request)
    assert [e.seq for e in cold.events.events] == [1, 4, 7, 10]
    hot, moved = _counted(sidecar, lambda: stub.Get(request, timeout=10))
    assert moved == {GETS: 1, READS: 0, READ_HERE: 0, HITS: 1}
    assert hot == cold
    # What the reply cache kept is the state's reply alone: a Get without events gets no events.
    plain, moved = _counted(sidecar, lambda: stub.Get(service_pb2.GetRequest(session_id="small"), timeout=10))
    assert moved[HITS] == 1 and not plain.HasField("events")
    stub.AppendEvents(service_pb2.AppendEventsRequest(session_id="small", events=_events(4)))
    newer = stub.Get(request, timeout=10)  # the state kept, the events read anew
    assert [e.seq for e in newer.events.events] == [1, 4, 7, 10, 11, 14] and newer == _expected(embedded, request)


def test_a_large_state_is_forwarded_and_its_reply_kept_without_the_events(
    sidecar: Sidecar, stub: service_pb2_grpc.CheckpointServiceStub, embedded: Store
) -> None:
    big = b"\x0a" + b"\x80\x88\x20" + b"b" * (INLINE_READ_MAX_OUTPUT_BYTES + 1024)  # one bytes field, > the bound
    stub.AppendEvents(
        service_pb2.AppendEventsRequest(session_id="big", events=_events(5), put=service_pb2.PutRequest(state=big))
    )
    request = service_pb2.GetRequest(session_id="big", events=service_pb2.ReadEventsRequest(newest_first=True))
    forwarded, moved = _counted(sidecar, lambda: stub.Get(request, timeout=10))
    assert moved == {GETS: 1, READS: 0, READ_HERE: 0, HITS: 0}
    assert forwarded == _expected(embedded, request) and forwarded.state == big
    hot, moved = _counted(sidecar, lambda: stub.Get(request, timeout=10))
    assert moved == {GETS: 1, READS: 0, READ_HERE: 0, HITS: 1}
    assert hot == forwarded
    plain = stub.Get(service_pb2.GetRequest(session_id="big"), timeout=10)
    assert not plain.HasField("events") and plain.state == big


def test_an_events_read_past_the_bound_is_forwarded_whole(
    sidecar: Sidecar, stub: service_pb2_grpc.CheckpointServiceStub, embedded: Store
) -> None:
    stub.AppendEvents(
        service_pb2.AppendEventsRequest(
            session_id="long", events=_events(MANY), put=service_pb2.PutRequest(state=b"\x0a\x01x")
        )
    )
    request = service_pb2.GetRequest(session_id="long", events=service_pb2.ReadEventsRequest(page_size=1000))
    stub.Get(service_pb2.GetRequest(session_id="long"), timeout=10)  # its state's reply kept
    forwarded, moved = _counted(sidecar, lambda: stub.Get(request, timeout=10))
    assert moved == {GETS: 1, READS: 0, READ_HERE: 0, HITS: 0}
    assert forwarded == _expected(embedded, request) and len(forwarded.events.events) == MANY
    # A page cut short continues with ReadEvents from its token.
    first = _get(stub, "long", page_size=50)
    rest = stub.ReadEvents(service_pb2.ReadEventsRequest(session_id="long", page_token=first.events.next_page_token))
    assert [e.seq for e in (*first.events.events, *rest.events)] == list(range(1, MANY + 1))


def test_a_masked_get_with_events(
    sidecar: Sidecar, stub: service_pb2_grpc.CheckpointServiceStub, embedded: Store
) -> None:
    put = service_pb2.PutRequest(state=TYPED.SerializeToString(), message_type="ckpt.v1.Checkpoint")
    stub.AppendEvents(service_pb2.AppendEventsRequest(session_id="typed", events=_events(3), put=put))
    request = service_pb2.GetRequest(session_id="typed", events=service_pb2.ReadEventsRequest(after_seq=1))
    request.field_mask.paths.append("handoff")
    for _ in range(3):  # read here, then the masked reply kept
        reply = stub.Get(request, timeout=10)
        assert checkpoint_pb2.Checkpoint.FromString(reply.state) == checkpoint_pb2.Checkpoint(handoff=TYPED.handoff)
        assert [e.seq for e in reply.events.events] == [2, 3]
        assert reply.info.state_size == len(TYPED.SerializeToString())


def test_a_session_with_no_events_answers_an_empty_page(stub: service_pb2_grpc.CheckpointServiceStub) -> None:
    stub.Put(service_pb2.PutRequest(session_id="quiet", state=b"\x0a\x01q"))
    for _ in range(2):
        reply = _get(stub, "quiet", session_id="quiet")
        assert reply.HasField("events") and not reply.events.events and not reply.events.next_page_token
        assert reply.state == b"\x0a\x01q"


def test_a_page_token_is_refused_on_a_session_with_versions_and_no_events(
    stub: service_pb2_grpc.CheckpointServiceStub,
) -> None:
    stub.Put(service_pb2.PutRequest(session_id="no-log", state=b"\x0a\x01n"))
    for _ in range(2):  # the second with its state's reply kept
        with pytest.raises(grpc.RpcError) as info:
            _get(stub, "no-log", page_token="abc")
        err: Any = info.value
        assert err.code() is grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert "events.page_token 'abc' is not a token" in err.details()
    with pytest.raises(grpc.RpcError) as info:
        stub.ReadEvents(service_pb2.ReadEventsRequest(session_id="no-log", page_token="not-a-token"), timeout=10)
    err = info.value
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT and "page_token 'not-a-token' is not a token" in err.details()


@pytest.mark.parametrize(
    ("events", "code", "part"),
    [
        ({"session_id": "other"}, grpc.StatusCode.INVALID_ARGUMENT, "events.session_id 'other' is not the session"),
        ({"page_size": 1001}, grpc.StatusCode.INVALID_ARGUMENT, "events.page_size must be in 0..1000"),
        ({"page_token": "nope"}, grpc.StatusCode.INVALID_ARGUMENT, "events.page_token 'nope' is not a token"),
        ({"types": [""]}, grpc.StatusCode.INVALID_ARGUMENT, "events.types[0] is 0 bytes"),
    ],
    ids=["session-mismatch", "page-size", "page-token", "type"],
)
def test_bad_events_fields_are_named(
    stub: service_pb2_grpc.CheckpointServiceStub, events: dict[str, Any], code: grpc.StatusCode, part: str
) -> None:
    stub.AppendEvents(
        service_pb2.AppendEventsRequest(
            session_id="errs", events=_events(2), put=service_pb2.PutRequest(state=b"\x0a\x01e")
        )
    )
    for _ in range(2):  # the second with its state's reply kept
        with pytest.raises(grpc.RpcError) as info:
            _get(stub, "errs", **events)
        err: Any = info.value
        assert err.code() is code and part in err.details(), err.details()


def test_a_malformed_events_field_is_refused_first_and_an_unknown_session_is_not_found(
    stub: service_pb2_grpc.CheckpointServiceStub,
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        _get(stub, "nobody", page_size=1001)
    err: Any = info.value
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as info:
        _get(stub, "nobody")
    err = info.value
    assert err.code() is grpc.StatusCode.NOT_FOUND and "'nobody' does not exist" in err.details()


_fields = st.builds(
    service_pb2.GetResponse,
    version=st.integers(0, 2**64 - 1),
    state=st.binary(max_size=300),
    message_type=st.text(max_size=20),
)


@given(reply=_fields, seqs=st.lists(st.integers(1, 2**40), max_size=5), token=st.text(max_size=10))
def test_a_reply_plus_the_events_part_is_the_composite_and_cut_back_is_the_reply(
    reply: service_pb2.GetResponse, seqs: list[int], token: str
) -> None:
    page = EventPage([records_pb2.StoredEvent(seq=s, type="t", payload=b"p") for s in seqs], token)
    body = reply.SerializeToString()
    composite = service_pb2.GetResponse.FromString(body + events_part(page))
    expected = service_pb2.GetResponse()
    expected.CopyFrom(reply)
    expected.events.CopyFrom(read_response_pb(page))
    assert composite == expected
    assert state_part(body + events_part(page)) == body
    assert state_part(expected.SerializeToString()) == body
