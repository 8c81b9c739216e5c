"""ReadEvents answered by the sidecar's gRPC process from LMDB (inlineevents.py), or forwarded past its bound.

A real `ckpt serve` on a real data directory; every page is checked against
Store.read_events, embedded, read-only on the same directory (the tokens
too, which name the log), and the metrics tell a read answered in the gRPC
process from a forwarded one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckpt.sidecar.config import StoreConfig
from ckpt.sidecar.server.eventconvert import event_query, read_response_pb
from ckpt.sidecar.server.inlineevents import INLINE_EVENTS_BOUND
from ckpt.sidecar.store.engine import Store
from ckpt.sidecar.store.events import SEAL_EVENTS
from ckpt.v1 import service_pb2, service_pb2_grpc
from tests.support import Sidecar, checkpoint_stub, metered_sidecar, metric, metrics_text, wait_for_metrics

SECOND = 1_000_000_000
#: Enough events for several sealed blocks and an open one.
LOG_EVENTS = 5 * SEAL_EVENTS + 37
TYPES = ("msg", "tool", "error")
READ_HERE = 'ckpt_read_by_grpc_process_total{rpc="ReadEvents"}'
READ_EVENTS = 'ckpt_requests_total{rpc="ReadEvents"}'


def _at(seconds: int) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(seconds * SECOND)
    return ts


def _event(i: int) -> service_pb2.Event:
    payload = json.dumps({"step": i, "content": "the agent called a tool " * (i % 7)}).encode()
    return service_pb2.Event(type=TYPES[i % len(TYPES)], payload=payload, time=_at(1000 + i), attributes={"n": str(i)})


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    with metered_sidecar(tmp_path_factory.mktemp("inline-events") / "data") as s:
        with checkpoint_stub(s.unix_target) as stub:
            events = [_event(i) for i in range(LOG_EVENTS)]
            for start in range(0, LOG_EVENTS, 200):
                stub.AppendEvents(service_pb2.AppendEventsRequest(session_id="log", events=events[start : start + 200]))
            stub.AppendEvents(service_pb2.AppendEventsRequest(session_id="one", events=[_event(0)]))
            stub.Put(service_pb2.PutRequest(session_id="no-events", state=b"\x08\x01"))
        yield s


@pytest.fixture(scope="module")
def stub(sidecar: Sidecar) -> Iterator[service_pb2_grpc.CheckpointServiceStub]:
    with checkpoint_stub(sidecar.unix_target) as stub:
        yield stub


@pytest.fixture(scope="module")
def embedded(sidecar: Sidecar) -> Iterator[Store]:
    """The same data directory, read in this process as the gRPC process reads it."""
    store = Store(StoreConfig(data_dir=sidecar.data_dir), readonly=True)
    yield store
    store.close()


def _pages(stub: service_pb2_grpc.CheckpointServiceStub, request: service_pb2.ReadEventsRequest) -> list[bytes]:
    """Every page of a read through the sidecar, each reply's bytes."""
    request = service_pb2.ReadEventsRequest.FromString(request.SerializeToString())
    out = []
    while True:
        page = stub.ReadEvents(request, timeout=10)
        out.append(page.SerializeToString(deterministic=True))
        if not page.next_page_token:
            return out
        request.page_token = page.next_page_token


def _embedded_pages(store: Store, request: service_pb2.ReadEventsRequest) -> list[bytes]:
    request = service_pb2.ReadEventsRequest.FromString(request.SerializeToString())
    out = []
    while True:
        page = read_response_pb(store.read_events(request.session_id, event_query(request)))
        out.append(page.SerializeToString(deterministic=True))
        if not page.next_page_token:
            return out
        request.page_token = page.next_page_token


def _served_here(sidecar: Sidecar, read: Callable[[], int]) -> bool:
    """Whether ``read()`` (returning how many ReadEvents calls it made) was answered by the gRPC process
    alone, judged by the metrics."""
    # Both counts from one scrape: an earlier test's calls answered here reach the metrics a moment after
    # their replies, and one landing between two scrapes would count in one figure and not the other.
    here, requests = _samples(sidecar, READ_HERE, READ_EVENTS)
    calls = read()
    # The gRPC process reports the calls it answered in link frames after the replies, a page read's
    # calls possibly over several frames: wait until every call made has been counted.
    wait_for_metrics(lambda: _samples(sidecar, READ_EVENTS)[0] - requests >= calls)
    here_now, requests_now = _samples(sidecar, READ_HERE, READ_EVENTS)
    return here_now - here == requests_now - requests


def _one_call(call: Callable[[], object]) -> Callable[[], int]:
    """A read for _served_here that makes one ReadEvents call."""

    def read() -> int:
        call()
        return 1

    return read


_requests = st.builds(
    service_pb2.ReadEventsRequest,
    session_id=st.sampled_from(["log", "one", "no-events"]),
    after_seq=st.one_of(st.just(0), st.integers(0, LOG_EVENTS + 5)),
    types=st.lists(st.sampled_from((*TYPES, "never")), max_size=2, unique=True),
    after=st.one_of(st.none(), st.integers(990, 1000 + LOG_EVENTS + 5).map(_at)),
    before=st.one_of(st.none(), st.integers(1000 + LOG_EVENTS - 300, 1000 + LOG_EVENTS + 5).map(_at)),
    newest_first=st.booleans(),
    page_size=st.sampled_from([0, 1, 7, 50, INLINE_EVENTS_BOUND.max_events, INLINE_EVENTS_BOUND.max_events + 1, 1000]),
).filter(
    lambda r: not (r.HasField("after") and r.HasField("before")) or r.after.ToNanoseconds() <= r.before.ToNanoseconds()
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=_requests)
def test_every_page_equals_the_embedded_stores(
    stub: service_pb2_grpc.CheckpointServiceStub, embedded: Store, request: service_pb2.ReadEventsRequest
) -> None:
    assert _pages(stub, request) == _embedded_pages(embedded, request)


@pytest.mark.parametrize(
    "request_",
    [
        service_pb2.ReadEventsRequest(session_id="log", newest_first=True, page_size=50),
        service_pb2.ReadEventsRequest(session_id="log", after_seq=LOG_EVENTS),  # empty, past the tail
        service_pb2.ReadEventsRequest(session_id="one", page_size=1000),
        service_pb2.ReadEventsRequest(session_id="no-events"),
        service_pb2.ReadEventsRequest(session_id="log", after_seq=LOG_EVENTS - 20, types=["tool"]),
    ],
    ids=["newest-50", "past-the-tail", "one-event", "versions-only", "filtered-tail"],
)
def test_a_small_read_is_answered_by_the_grpc_process(
    sidecar: Sidecar, stub: service_pb2_grpc.CheckpointServiceStub, embedded: Store, request_: Any
) -> None:
    pages: list[bytes] = []

    def read() -> int:
        pages.extend(_pages(stub, request_))
        return len(pages)

    assert _served_here(sidecar, read)
    assert pages == _embedded_pages(embedded, request_)


@pytest.mark.parametrize(
    "request_",
    [
        # More events on the page than the bound takes.
        service_pb2.ReadEventsRequest(session_id="log", page_size=INLINE_EVENTS_BOUND.max_events + 1),
        # No event is that late: every block is visited (skipped by its times), past the bound's. (A type
        # with no event is answered by the log's record without a block: test_event_type_bounds.py.)
        service_pb2.ReadEventsRequest(session_id="log", after=_at(10**6)),
    ],
    ids=["many-events", "many-blocks"],
)
def test_a_read_past_the_bound_is_forwarded_and_answered_alike(
    sidecar: Sidecar, stub: service_pb2_grpc.CheckpointServiceStub, embedded: Store, request_: Any
) -> None:
    page = service_pb2.ReadEventsResponse()
    here = _sample(sidecar, READ_HERE)
    _served_here(sidecar, _one_call(lambda: page.CopyFrom(stub.ReadEvents(request_, timeout=10))))
    assert _sample(sidecar, READ_HERE) == here
    assert [page.SerializeToString(deterministic=True)] == _embedded_pages(embedded, request_)[:1]


def test_an_acknowledged_append_is_read_at_once(sidecar: Sidecar) -> None:
    """The writer and the reader on connections of their own, as two agents' would be."""
    with grpc.insecure_channel(sidecar.unix_target) as a, grpc.insecure_channel(sidecar.tcp_target) as b:
        writer, reader = service_pb2_grpc.CheckpointServiceStub(a), service_pb2_grpc.CheckpointServiceStub(b)
        newest = service_pb2.ReadEventsRequest(session_id="fresh", newest_first=True, page_size=1)
        here = _sample(sidecar, READ_HERE)
        for i in range(1, SEAL_EVENTS + 20):  # across a block sealed and a new one begun
            reply = writer.AppendEvents(service_pb2.AppendEventsRequest(session_id="fresh", events=[_event(i)]))
            assert reply.last_seq == i
            page = reader.ReadEvents(newest, timeout=10)
            assert [(e.seq, e.payload) for e in page.events] == [(i, _event(i).payload)]
            past = reader.ReadEvents(service_pb2.ReadEventsRequest(session_id="fresh", after_seq=i), timeout=10)
            assert not past.events and not past.next_page_token
    wait_for_metrics(lambda: _sample(sidecar, READ_HERE) >= here + 2 * (SEAL_EVENTS + 19))
    assert _sample(sidecar, READ_HERE) == here + 2 * (SEAL_EVENTS + 19)


@pytest.mark.parametrize(
    ("request_", "code", "part"),
    [
        (
            service_pb2.ReadEventsRequest(session_id="never-written"),
            grpc.StatusCode.NOT_FOUND,
            "session 'never-written' does not exist (it has neither events nor versions)",
        ),
        (
            service_pb2.ReadEventsRequest(session_id="log", page_token="not-a-token"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "page_token 'not-a-token' is not a token this server issued",
        ),
        (
            service_pb2.ReadEventsRequest(session_id="log", page_size=1001),
            grpc.StatusCode.INVALID_ARGUMENT,
            "page_size must be in 0..1000",
        ),
        (
            service_pb2.ReadEventsRequest(session_id="log", types=[""]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "types[0] is 0 bytes",
        ),
        (
            service_pb2.ReadEventsRequest(session_id="log", types=[f"t{i}" for i in range(1001)]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "types names 1001 event types; a read filters by at most 1000",
        ),
    ],
    ids=["unknown-session", "bad-page-token", "bad-page-size", "bad-type", "too-many-types"],
)
def test_bad_requests_are_forwarded_and_get_the_store_processs_status(
    sidecar: Sidecar, stub: service_pb2_grpc.CheckpointServiceStub, request_: Any, code: grpc.StatusCode, part: str
) -> None:
    failed: list[tuple[grpc.StatusCode, str]] = []

    def read() -> int:
        with pytest.raises(grpc.RpcError) as info:
            stub.ReadEvents(request_, timeout=10)
        err: Any = info.value
        failed.append((err.code(), err.details()))
        return 1

    errors = f'ckpt_errors_total{{code="{code.name}",rpc="ReadEvents"}}'
    counted = _sample(sidecar, errors)
    here = _sample(sidecar, READ_HERE)
    _served_here(sidecar, read)
    assert _sample(sidecar, READ_HERE) == here
    [(got, details)] = failed
    assert got is code and part in details, details
    assert _sample(sidecar, errors) == counted + 1


def _sample(sidecar: Sidecar, name: str) -> float:
    """A labelled sample of /metrics, 0 until its first count."""
    return _samples(sidecar, name)[0]


def _samples(sidecar: Sidecar, *names: str) -> list[float]:
    """Labelled samples of one scrape of /metrics, each 0 until its first count."""
    text = metrics_text(sidecar)
    found = [re.search(rf"^{re.escape(name)} (\S+)$", text, re.M) for name in names]
    return [float(f.group(1)) if f else 0.0 for f in found]


def test_a_cut_request_is_forwarded_and_refused_as_before(sidecar: Sidecar) -> None:
    """Bytes that do not parse as a ReadEventsRequest: the store process names what is wrong."""
    raw = service_pb2.ReadEventsRequest(session_id="log", page_size=5).SerializeToString()[:-1]
    with grpc.insecure_channel(sidecar.unix_target) as channel:
        call = channel.unary_unary("/ckpt.v1.CheckpointService/ReadEvents")
        with pytest.raises(grpc.RpcError) as info:
            call(raw, timeout=10)
    err: Any = info.value
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT, err.details()


def test_a_read_here_counts_its_seconds_as_a_read_events(
    sidecar: Sidecar, stub: service_pb2_grpc.CheckpointServiceStub
) -> None:
    seconds = 'ckpt_request_seconds_count{rpc="ReadEvents"}'
    before = metric(sidecar, seconds)
    assert _served_here(sidecar, _one_call(lambda: stub.ReadEvents(service_pb2.ReadEventsRequest(session_id="one"))))
    assert metric(sidecar, seconds) == before + 1
