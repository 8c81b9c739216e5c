"""A Get with events (GetRequest.events) whose state leaves little of the reply: the page holds what
max_state_bytes leaves beside the state and ends early (empty if not even its first event fits), its
token continuing with ReadEvents, whether the store process reads both or the gRPC process reads the
page beside the state its reply cache kept. A real sidecar with a 1 MiB message limit."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from ckpt.sidecar.limits import MESSAGE_ENVELOPE_BYTES
from ckpt.sidecar.server.storelink import SERVED_REPORT_SECONDS
from ckpt.v1 import service_pb2, service_pb2_grpc
from tests.support import Sidecar, metric, start_sidecar_with_metrics

MAX_MESSAGE_BYTES = 1 << 20
MAX_STATE_BYTES = MAX_MESSAGE_BYTES - MESSAGE_ENVELOPE_BYTES
#: Bytes a page counts for an event besides its encoding (eventreads.py).
EVENT_OVERHEAD_BYTES = 8
HITS = "ckpt_reply_cache_hits_total"
GETS = 'ckpt_requests_total{rpc="Get"}'


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    data = tmp_path_factory.mktemp("get-events-large-state") / "data"
    s = start_sidecar_with_metrics(data, "--max-message-bytes", str(MAX_MESSAGE_BYTES))
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture(scope="module")
def stub(sidecar: Sidecar) -> Iterator[service_pb2_grpc.CheckpointServiceStub]:
    options = [("grpc.max_receive_message_length", 8 << 20), ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
    with grpc.insecure_channel(sidecar.unix_target, options=options) as channel:
        yield service_pb2_grpc.CheckpointServiceStub(channel)


def _hit(sidecar: Sidecar, call: Callable[[], Any]) -> tuple[Any, bool]:
    """``call()``'s answer, and whether the reply cache answered its state (else the store process read it:
    a state over the gRPC process's read bound is never read there)."""
    time.sleep(4 * SERVED_REPORT_SECONDS)  # calls made before this one are reported by now
    gets, hits = metric(sidecar, GETS, missing=0), metric(sidecar, HITS, missing=0)
    answer = call()
    deadline = time.monotonic() + 5
    while metric(sidecar, GETS, missing=0) == gets:  # a call answered in the gRPC process is reported later
        assert time.monotonic() < deadline, "timed out waiting for the metrics"
        time.sleep(0.02)
    return answer, metric(sidecar, HITS, missing=0) > hits


def _get(stub: service_pb2_grpc.CheckpointServiceStub, sid: str, **events: Any) -> service_pb2.GetResponse:
    reply: service_pb2.GetResponse = stub.Get(
        service_pb2.GetRequest(session_id=sid, events=service_pb2.ReadEventsRequest(**events)), timeout=30
    )
    return reply


def _rest(stub: service_pb2_grpc.CheckpointServiceStub, sid: str, token: str, **events: Any) -> list[int]:
    """The seqs ReadEvents reads on from ``token`` to the end of the log."""
    seqs: list[int] = []
    while token:
        page = stub.ReadEvents(service_pb2.ReadEventsRequest(session_id=sid, page_token=token, **events), timeout=30)
        seqs += [e.seq for e in page.events]
        token = page.next_page_token
    return seqs


def _page_bytes(reply: service_pb2.GetResponse) -> int:
    return sum(e.ByteSize() + EVENT_OVERHEAD_BYTES for e in reply.events.events)


@pytest.mark.parametrize("newest_first", [False, True], ids=["oldest-first", "newest-first"])
def test_the_page_ends_where_the_state_leaves_no_room_and_reads_on_with_read_events(
    sidecar: Sidecar, stub: service_pb2_grpc.CheckpointServiceStub, newest_first: bool
) -> None:
    sid = f"large-{newest_first}"
    state = b"s" * 950_000  # under max_state_bytes; with 100 KB of events, over the message limit
    stub.Put(service_pb2.PutRequest(session_id=sid, state=state), timeout=30)
    events = [service_pb2.Event(type="t", payload=b"%03d" % i + b"e" * 997) for i in range(100)]
    stub.AppendEvents(service_pb2.AppendEventsRequest(session_id=sid, events=events), timeout=30)
    every = list(range(100, 0, -1)) if newest_first else list(range(1, 101))
    for from_cache in (False, True):  # the store process reads both; then the page beside the reply kept
        reply, hit = _hit(sidecar, lambda: _get(stub, sid, newest_first=newest_first, page_size=100))
        assert hit is from_cache
        assert reply.state == state
        seqs = [e.seq for e in reply.events.events]
        assert 0 < len(seqs) < 100 and reply.events.next_page_token
        assert len(state) + _page_bytes(reply) <= MAX_STATE_BYTES
        rest = _rest(stub, sid, reply.events.next_page_token, newest_first=newest_first)
        assert seqs + rest == every


@pytest.mark.parametrize(
    ("state_bytes", "first_bytes"),
    [(900_000, 900_000), (960_000, 30_000)],
    ids=["event-as-large-as-the-state", "event-within-the-grpc-process-read-bound"],
)
def test_an_event_too_large_to_fit_beside_the_state_leaves_the_page_empty_with_a_token_to_it(
    sidecar: Sidecar, stub: service_pb2_grpc.CheckpointServiceStub, state_bytes: int, first_bytes: int
) -> None:
    sid = f"no-room-{state_bytes}"
    state = b"s" * state_bytes
    stub.Put(service_pb2.PutRequest(session_id=sid, state=state), timeout=30)
    for payload in (b"f" * first_bytes, b"g" * 100):
        stub.AppendEvents(
            service_pb2.AppendEventsRequest(session_id=sid, events=[service_pb2.Event(type="t", payload=payload)]),
            timeout=30,
        )
    # The first Get is the store process's; the second's state comes from the reply cache, its page read
    # in the gRPC process when the event is within that read's bound, else forwarded whole.
    hits = []
    for _ in range(2):
        reply, hit = _hit(sidecar, lambda: _get(stub, sid))
        hits.append(hit)
        assert reply.state == state
        assert not reply.events.events and reply.events.next_page_token
        # ReadEvents from the token reads the event (a page holds one at least), then the rest.
        page = stub.ReadEvents(
            service_pb2.ReadEventsRequest(session_id=sid, page_token=reply.events.next_page_token), timeout=30
        )
        assert [len(e.payload) for e in page.events][:1] == [first_bytes]
        assert [e.seq for e in page.events] + _rest(stub, sid, page.next_page_token) == [1, 2]
    assert hits == [False, first_bytes < 96 * 1024]
