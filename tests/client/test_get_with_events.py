"""get(..., events=EventFilter(...)): a state and a page of its session's events in one call, through a
real sidecar, from both clients: the page is what ``events`` reads."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from ckpt.sidecar.client import CheckpointClient, EventFilter, InvalidArgumentError, NotFoundError, event
from ckpt.v1 import service_pb2
from tests.client.support import FLAVOURS, AsyncDriven
from tests.support import Sidecar

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)

FILTERS = [
    EventFilter(),
    EventFilter(types=("tool",)),
    EventFilter(after_seq=40, newest_first=True, page_size=5),
    EventFilter(after=T0 + datetime.timedelta(seconds=10), before=T0 + datetime.timedelta(seconds=20)),
    EventFilter(page_size=1000),
]


def _client(flavour: str, target: str) -> Any:
    return CheckpointClient(target) if flavour == "sync" else AsyncDriven(target)


def _read(client: Any, session_id: str, read: EventFilter, page_token: str = "") -> list[service_pb2.Event]:
    kwargs: dict[str, Any] = {
        "after_seq": read.after_seq,
        "types": read.types,
        "after": read.after,
        "before": read.before,
        "newest_first": read.newest_first,
        "page_size": read.page_size,
        "page_token": page_token,
    }
    if isinstance(client, AsyncDriven):

        async def pages() -> list[service_pb2.Event]:
            return [e async for e in client.client.events(session_id, **kwargs)]

        return client.run(pages())
    return list(client.events(session_id, **kwargs))


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_get_with_events_reads_what_events_reads(sidecar: Sidecar, flavour: str) -> None:
    client = _client(flavour, sidecar.unix_target)
    try:
        steps = [
            event("tool" if i % 2 else "msg", b"%d" % i, time=T0 + datetime.timedelta(seconds=i)) for i in range(150)
        ]
        put = service_pb2.PutRequest(state=b"\x08\x01")
        if isinstance(client, AsyncDriven):
            client.run(client.client.append_events("s", steps, put=put))
        else:
            client.append_events("s", steps, put=put)
        for read in FILTERS:
            reply = client.get("s", events=read)
            assert reply.state == b"\x08\x01" and reply.version == 1
            page = list(reply.events.events)
            assert len(page) <= read.page_size
            rest = _read(client, "s", read, reply.events.next_page_token) if reply.events.next_page_token else []
            assert [e.SerializeToString() for e in page + rest] == [
                e.SerializeToString() for e in _read(client, "s", read)
            ]
            assert bool(reply.events.next_page_token) == (len(_read(client, "s", read)) > len(page))
        assert not client.get("s").HasField("events")  # without the filter, no events are read
        client.put("quiet", b"\x08\x02")
        quiet = client.get("quiet", events=EventFilter())
        assert quiet.HasField("events") and not quiet.events.events
        with pytest.raises(NotFoundError):
            client.get("nobody", events=EventFilter())
    finally:
        client.close()


def test_a_bad_filter_is_refused_before_it_is_sent(sidecar: Sidecar) -> None:
    with CheckpointClient(sidecar.unix_target) as client:
        with pytest.raises(ValueError, match="page_size"):
            client.get("s", events=EventFilter(page_size=1001))
        with pytest.raises(TypeError, match="types must be an iterable of str, not a str"):
            client.get("s", events=EventFilter(types="tool"))
        client.put("s", b"\x08\x01")
        with pytest.raises(InvalidArgumentError, match=r"events\.types\[0\]"):
            client.get("s", events=EventFilter(types=("bad\x01",)))
