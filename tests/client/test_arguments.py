"""Bad arguments are refused by the client, by name, before anything is sent; and what put_stream takes."""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from ckpt.sidecar.client import CheckpointClient
from ckpt.v1 import service_pb2
from tests.client.support import FLAVOURS, PATCH, merge, open_client, versions
from tests.support import Sidecar

BAD_CALLS: list[tuple[str, Callable[[Any], Any], type[Exception], str]] = [
    ("state None", lambda c: c.put("args", None), TypeError, "state must be bytes, not NoneType"),
    ("patch str", lambda c: c.merge("args", "x"), TypeError, "patch must be bytes, not str"),
    ("session int", lambda c: c.put(5, b""), TypeError, "session_id must be a str, not int"),
    ("session None", lambda c: c.get(None), TypeError, "session_id must be a str, not NoneType"),
    ("version -1", lambda c: c.get("args", -1), ValueError, "version must be >= 0, got -1"),
    ("version str", lambda c: c.get("args", "2"), TypeError, "version must be an int, not str"),
    ("expected bool", lambda c: c.put("args", b"", expected_version=True), TypeError, "expected_version must be"),
    ("expected -1", lambda c: c.put("args", b"", expected_version=-1), ValueError, "expected_version must be >= 0"),
    ("request_id int", lambda c: c.put("args", b"", request_id=7), TypeError, "request_id must be a str, not int"),
    ("label value", lambda c: c.put("args", b"", labels={"k": 1}), TypeError, r"labels\['k'\] must be a str"),
    ("labels list", lambda c: c.put("args", b"", labels=[("k", "v")]), TypeError, "labels must be a mapping"),
    ("fork version", lambda c: c.fork("args", "f", version=-2), ValueError, "version must be >= 0, got -2"),
    ("new id", lambda c: c.fork("args", b"f"), TypeError, "new_session_id must be a str, not bytes"),
    ("delete", lambda c: c.delete(None), TypeError, "session_id must be a str"),
    ("page -1", lambda c: list(c.history("args", page_size=-1)), ValueError, r"page_size must be in 0\.\.1000, got -1"),
    ("page big", lambda c: list(c.sessions(page_size=10**10)), ValueError, r"page_size must be in 0\.\.1000"),
    ("filter", lambda c: list(c.sessions(labels={"k": None})), TypeError, r"labels\['k'\] must be a str"),
    ("after str", lambda c: list(c.sessions(updated_after="2026")), TypeError, "updated_after must be a datetime"),
    (
        "before naive",
        lambda c: list(c.sessions(updated_before=datetime.datetime(2026, 1, 1))),
        ValueError,
        "updated_before must be timezone-aware",
    ),
    ("surrogate", lambda c: c.put("s\udc80", b"x"), ValueError, r"session_id is not valid UTF-8: a lone surrogate"),
    ("surrogate id", lambda c: c.put("s", b"x", request_id="r\udc80"), ValueError, "request_id is not valid UTF-8"),
    ("surrogate label", lambda c: c.put("s", b"", labels={"k": "v\udc80"}), ValueError, r"labels\['k'\] is not valid"),
    ("surrogate key", lambda c: c.put("s", b"", labels={"k\udc80": "v"}), ValueError, "labels key 'k\\\\udc80' is not"),
    ("surrogate fork", lambda c: c.fork("s", "t\udc80"), ValueError, "new_session_id is not valid UTF-8"),
]


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize(("name", "call", "error", "match"), BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_arguments_are_refused_by_name_and_write_nothing(
    sidecar: Sidecar, flavour: str, name: str, call: Callable[[Any], Any], error: type[Exception], match: str
) -> None:
    """`put(s, None)` used to store an empty state; other bad types came out as protobuf's
    'bad argument type for built-in operation' or 'Value out of range: -1', naming no argument; a lone
    surrogate as a bare UnicodeEncodeError."""
    with open_client(flavour, sidecar.unix_target) as c, pytest.raises(error, match=match):
        call(c)
    assert versions(sidecar.unix_target, "args") == []


def _bad_puts() -> Iterator[service_pb2.PutRequest]:
    yield merge("gen")
    raise RuntimeError("the agent's own generator failed")


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize(
    ("puts", "batch_size", "error", "match"),
    [
        (lambda: [service_pb2.PutRequest(session_id="b", state=PATCH)], 0, ValueError, "batch_size must be >= 1"),
        (lambda: [service_pb2.PutRequest(session_id="b", state=PATCH)], 1001, ValueError, "batch_size must be <= 1000"),
        (lambda: [{"session_id": "b"}], 64, TypeError, r"puts\[0\] is a dict, not a ckpt.v1.PutRequest"),
        (lambda: 3, 64, TypeError, "puts must be an iterable of ckpt.v1.PutRequest, not int"),
        (_bad_puts, 64, RuntimeError, "the agent's own generator failed"),
    ],
)
def test_put_stream_raises_the_callers_own_error(
    sidecar: Sidecar, flavour: str, puts: Callable[[], Any], batch_size: int, error: type[Exception], match: str
) -> None:
    """The sync client used to report any of these as CheckpointError(UNKNOWN, 'Exception iterating
    requests!'), grpc's words for an exception in its request-reading thread."""
    with open_client(flavour, sidecar.unix_target) as c, pytest.raises(error, match=match):
        list(c.put_stream(puts(), batch_size=batch_size))


async def _steps() -> AsyncIterator[service_pb2.PutRequest]:
    yield merge("x")


def test_the_sync_client_names_an_async_iterable_given_to_put_stream(sidecar: Sidecar) -> None:
    with CheckpointClient(sidecar.unix_target) as c, pytest.raises(TypeError, match="puts is an async iterable"):
        c.put_stream(_steps())  # type: ignore[arg-type]
