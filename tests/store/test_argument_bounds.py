"""The embedded Store's arguments at and past their bounds: InvalidArgument naming the argument and its limit,
never a bare TypeError or struct.error, nor a wrong answer; sizes counted in bytes, whatever the buffer."""

from __future__ import annotations

import array
import asyncio
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt.sidecar import InvalidArgument, NotFound, ResourceExhausted, StateTooLarge, Store, StoreConfig
from ckpt.sidecar.store import EventQuery, NewEvent, PutRequest

U64 = 2**64 - 1
#: EventQuery, to build with field values its annotations do not allow.
Query: Any = EventQuery
# 500 items of 8 bytes: len() says 500, the buffer holds 4,000 bytes.
WIDE: Any = memoryview(array.array("q", range(500)))  # Any: the store takes any bytes-like state


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    config = StoreConfig(data_dir=tmp_path / "data", max_state_bytes=1000, max_blob_bytes=1000)
    with Store(config) as s:
        for i in range(5):
            s.put("a", b"x%d" % i)
        s.append_events("a", [NewEvent("tool_call"), NewEvent("other")])
        yield s


Call = Callable[[Any], Any]  # a Store, called with arguments its signature does not allow

REFUSED: list[tuple[str, Call, str]] = [
    # Listings' page arguments.
    (
        "list_versions page_size float",
        lambda s: s.list_versions("a", page_size=2.5),
        r"^page_size must be an int .*float$",
    ),
    (
        "list_versions page_size bool",
        lambda s: s.list_versions("a", page_size=True),
        r"^page_size must be an int .*bool$",
    ),
    (
        "list_versions page_size -1",
        lambda s: s.list_versions("a", page_size=-1),
        r"^page_size must be in 0\.\..*, got -1$",
    ),
    (
        "list_versions page_token int",
        lambda s: s.list_versions("a", page_token=5),
        r"^page_token must be a str, not int$",
    ),
    (
        "list_versions max_page_bytes str",
        lambda s: s.list_versions("a", max_page_bytes="10"),
        r"^max_page_bytes must be an int \(0 = no limit\), not str$",
    ),
    (
        "list_versions max_page_bytes -1",
        lambda s: s.list_versions("a", max_page_bytes=-1),
        r"^max_page_bytes must be in 0\.\.\d+ \(0 = no limit\), got -1$",
    ),
    ("list_sessions page_size float", lambda s: s.list_sessions(page_size=1.5), r"^page_size must be an int"),
    ("list_sessions max_page_bytes str", lambda s: s.list_sessions(max_page_bytes="1"), r"^max_page_bytes must be"),
    (
        "list_sessions updated_after_nanos float",
        lambda s: s.list_sessions(updated_after_nanos=1.5),
        r"^updated_after_nanos must be an int or None .*, not float$",
    ),
    (
        "list_sessions updated_after_nanos bool",
        lambda s: s.list_sessions(updated_after_nanos=True),
        r"^updated_after_nanos must be an int or None .*, not bool$",
    ),
    (
        "list_sessions updated_before_nanos past u64",
        lambda s: s.list_sessions(updated_before_nanos=U64 + 1),
        rf"^updated_before_nanos must be in -\d+\.\.{U64} .*, got {U64 + 1}$",
    ),
    # Versions and times stored as uint64.
    ("get version 2**64", lambda s: s.get("a", U64 + 1), r"^version must be in 0\.\.2\*\*64-1 \(a uint64\)"),
    ("get_cached version 2**64", lambda s: s.get_cached("a", U64 + 1), r"^version must be in 0\.\.2\*\*64-1"),
    ("fork version 2**64", lambda s: s.fork("a", U64 + 1, "f"), r"^version must be in 0\.\.2\*\*64-1"),
    (
        "get max_state_bytes str",
        lambda s: s.get("a", use_cache=False, max_state_bytes="5"),
        r"^max_state_bytes must be",
    ),
    ("is_head version str", lambda s: s.is_head("a", "5", 0, full_frame=True), r"^version must be an int, not str$"),
    ("is_head version 2**64", lambda s: s.is_head("a", U64 + 1, 0, full_frame=True), r"^version must be in 0\.\.2"),
    (
        "is_head created -1",
        lambda s: s.is_head("a", 5, -1, full_frame=True),
        r"^created_unix_nanos must be in 0\.\.2\*\*64-1 \(a uint64\), got -1$",
    ),
    ("sweep now_nanos str", lambda s: s.sweep(now_nanos="5"), r"^now_nanos must be an int, not str$"),
    ("sweep now_nanos float", lambda s: s.sweep(now_nanos=1.5e18), r"^now_nanos must be an int, not float$"),
    (
        "sweep now_nanos -1",
        lambda s: s.sweep(now_nanos=-1),
        r"^now_nanos must be in 0\.\.2\*\*64-1 \(a uint64\), got -1$",
    ),
    # Event reads.
    (
        "read_events types str",
        lambda s: s.read_events("a", Query(types="tool_call")),
        r"^types must be a tuple of event types, not str$",
    ),
    (
        "read_events max_page_bytes str",
        lambda s: s.read_events("a", max_page_bytes="4"),
        r"^max_page_bytes must be an int \(0 = no limit\), not str$",
    ),
    (
        "read_events after_seq 2**64",
        lambda s: s.read_events("a", EventQuery(after_seq=U64 + 1)),
        r"^after_seq must be in 0\.\.2\*\*64-1",
    ),
    (
        "read_events page_token int",
        lambda s: s.read_events("a", Query(page_token=5)),
        r"^page_token must be a str",
    ),
    (
        "read_events after_unix_nanos float",
        lambda s: s.read_events("a", Query(after_unix_nanos=1.5)),
        r"^after_unix_nanos must be an int or None",
    ),
    (
        "get_with_events max_page_bytes str",
        lambda s: s.get_with_events("a", events=EventQuery(), max_page_bytes="4"),
        r"^max_page_bytes must be an int",
    ),
    (
        "get_with_events types str",
        lambda s: s.get_with_events("a", events=Query(types="tool_call")),
        r"^events\.types must be a tuple of event types, not str$",
    ),
    (
        "read_events types dict",
        lambda s: s.read_events("a", Query(types={"tool_call": 1})),
        r"^types must be a tuple of event types, not dict$",
    ),
    (
        "read_events types the dict class",
        lambda s: s.read_events("a", Query(types=dict)),
        r"^types must be a tuple of event types, not type$",
    ),
    # Many writes: an iterable of PutRequests whose order is theirs, each a PutRequest.
    (
        "put_many dict",
        lambda s: s.put_many({"p": PutRequest("p", b"\x08\x01")}),
        r"^requests must be an iterable of PutRequest \(a list, a tuple, a generator\), not dict$",
    ),
    ("put_many str", lambda s: s.put_many("p"), r"^requests must be an iterable of PutRequest .*, not str$"),
    ("put_many bytes", lambda s: s.put_many(b"p"), r"^requests must be an iterable of PutRequest .*, not bytes$"),
    ("put_many set", lambda s: s.put_many(set()), r"^requests must be an iterable of PutRequest .*, not set$"),
    ("put_many None", lambda s: s.put_many(None), r"^requests must be an iterable of PutRequest .*, not NoneType$"),
    (
        "put_many one PutRequest",
        lambda s: s.put_many(PutRequest("p", b"\x08\x01")),
        r"^requests must be an iterable of PutRequest .*, not PutRequest$",
    ),
    (
        "put_many an item not a PutRequest",
        lambda s: s.put_many((PutRequest("p", b"\x08\x01"), ("p", b"\x08\x02"))),
        r"^requests\[1\] must be a PutRequest, not tuple$",
    ),
    (
        "asubmit not a PutRequest",
        lambda s: asyncio.run(_asubmit(s, ("p", b"\x08\x01"))),
        r"^request must be a PutRequest, not tuple$",
    ),
]


async def _asubmit(store: Store, request: Any) -> Any:
    return await store.asubmit(request)


@pytest.mark.parametrize(("call", "match"), [case[1:] for case in REFUSED], ids=[case[0] for case in REFUSED])
def test_an_argument_past_its_bound_is_refused_naming_it_and_its_limit(store: Store, call: Call, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        call(store)


ACCEPTED: list[tuple[str, Call, Any]] = [
    ("list_versions page_size 0 (the default)", lambda s: len(s.list_versions("a", page_size=0)[0]), 5),
    ("list_versions page_size 2", lambda s: len(s.list_versions("a", page_size=2)[0]), 2),
    ("list_sessions updated_after_nanos 0", lambda s: len(s.list_sessions(updated_after_nanos=0)[0]), 1),
    ("list_sessions updated_before_nanos u64", lambda s: len(s.list_sessions(updated_before_nanos=U64)[0]), 1),
    ("is_head version u64", lambda s: s.is_head("a", U64, U64, full_frame=True), False),
    ("sweep now_nanos 0", lambda s: s.sweep(now_nanos=0).versions_removed, 0),
    ("read_events after_seq u64", lambda s: len(s.read_events("a", EventQuery(after_seq=U64)).events), 0),
    (
        "read_events types tuple",
        lambda s: [e.type for e in s.read_events("a", EventQuery(types=("tool_call",))).events],
        ["tool_call"],
    ),
    (
        "read_events types list",
        lambda s: [e.type for e in s.read_events("a", Query(types=["other"])).events],
        ["other"],
    ),
    (
        "put_many tuple",
        lambda s: [r.version for r in s.put_many((PutRequest("a", b"x5"), PutRequest("a", b"x6")))],
        [6, 7],
    ),
    (
        "put_many generator",
        lambda s: [r.version for r in s.put_many(PutRequest("a", b"x%d" % i) for i in (5, 6))],
        [6, 7],
    ),
    ("put_many an empty list", lambda s: s.put_many([]), []),
]


@pytest.mark.parametrize(("call", "expected"), [case[1:] for case in ACCEPTED], ids=[case[0] for case in ACCEPTED])
def test_an_argument_at_its_bound_is_taken(store: Store, call: Call, expected: Any) -> None:
    assert call(store) == expected


def test_a_version_at_the_uint64_bound_is_looked_up_not_refused(store: Store) -> None:
    with pytest.raises(NotFound):
        store.get("a", U64)
    with pytest.raises(NotFound):
        store.fork("a", U64, "f")


def test_a_wide_memoryview_state_counts_its_bytes_against_max_state_bytes(store: Store) -> None:
    assert (len(WIDE), WIDE.nbytes) == (500, 4000)
    with pytest.raises(StateTooLarge, match=r"^state is 4000 bytes; the limit \(max_state_bytes\) is 1000$"):
        store.put("m", WIDE)
    narrow: Any = memoryview(array.array("q", range(100)))  # 800 bytes: within the limit, stored whole
    assert store.put("m", narrow).state_size == 800
    assert store.get("m", use_cache=False).state == narrow.tobytes()


def test_wide_memoryview_event_payloads_count_their_bytes_against_max_state_bytes(store: Store) -> None:
    with pytest.raises(StateTooLarge, match=r"more than 1000 bytes by events\[0\]"):
        store.append_events("a", [NewEvent("big", WIDE)])
    assert store.read_events("a", EventQuery(types=("big",))).events == []


def test_wide_memoryview_blob_chunks_count_their_bytes_and_are_stored_whole(store: Store) -> None:
    with pytest.raises(ResourceExhausted, match="max_blob_bytes"):
        store.put_blob("a", [WIDE])
    narrow: Any = memoryview(array.array("q", range(100)))
    info = store.put_blob("a", [narrow, b"tail"])
    assert info.size_bytes == 804
    with store.blob_files.open(info.sha256) as f:
        assert f.read() == narrow.tobytes() + b"tail"
    with pytest.raises(InvalidArgument, match=r"^a blob's chunks must be bytes, not str$"):
        store.put_blob("a", ["abc"])  # type: ignore[list-item]


LONE_REQUEST_ID = r"^request_id '\\ud800' is not valid UTF-8 \(lone surrogate\)$"


def test_a_request_id_holding_a_lone_surrogate_is_refused_on_every_write(store: Store) -> None:
    """It was taken (encoded with surrogatepass), though a request id is UTF-8 as a session id is."""
    with pytest.raises(InvalidArgument, match=LONE_REQUEST_ID):
        store.put("r", b"x", request_id="\ud800")
    [refused] = store.put_many([PutRequest("r", b"x", request_id="\ud800")])
    assert isinstance(refused, InvalidArgument) and re.match(LONE_REQUEST_ID, str(refused)), refused
    with pytest.raises(InvalidArgument, match=LONE_REQUEST_ID):
        store.append_events("r", [NewEvent("t")], request_id="\ud800")

    async def from_asyncio() -> None:
        with pytest.raises(InvalidArgument, match=LONE_REQUEST_ID):
            await store.asubmit(PutRequest("r", b"x", request_id="\ud800"))
        with pytest.raises(InvalidArgument, match=LONE_REQUEST_ID):
            await store.aappend_events("r", [NewEvent("t")], request_id="\ud800")

    asyncio.run(from_asyncio())
    with pytest.raises(NotFound, match="neither events nor versions"):  # nothing was written
        store.read_events("r", EventQuery())
