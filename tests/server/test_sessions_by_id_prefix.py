"""ListSessions' session_id_prefix through a real sidecar: only the sessions whose id starts with it, those
holding only events too when it is the only filter, a narrowing of the label and update-time filters, pages
that end at the prefix's last id, and prefixes refused by name (too long, another listing's token, bytes
that cut a character)."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from ckpt.sidecar.client import AsyncCheckpointClient, CheckpointClient, InvalidArgumentError
from ckpt.v1 import service_pb2, service_pb2_grpc
from tests.support import Sidecar, start_sidecar

#: Sessions with a checkpoint ("team" label red, but "a/2" blue); "a/3" and "z" hold only events.
WITH_CHECKPOINTS = ("a", "a/1", "a/2", "a0", "b/1", "é1", "éa", "ê")
EVENTS_ONLY = ("a/3", "z")


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    s = start_sidecar(tmp_path / "data")
    try:
        with CheckpointClient(s.unix_target) as c:
            for sid in WITH_CHECKPOINTS:
                c.put(sid, b"state", labels={"team": "blue" if sid == "a/2" else "red"})
            for sid in EVENTS_ONLY:
                c.append_events(sid, [service_pb2.Event(type="note", payload=b"p")])
        yield s
    finally:
        assert s.stop() == 0, s.log()


def _stub(sidecar: Sidecar) -> tuple[grpc.Channel, service_pb2_grpc.CheckpointServiceStub]:
    channel = grpc.insecure_channel(sidecar.unix_target)
    return channel, service_pb2_grpc.CheckpointServiceStub(channel)


def test_a_prefix_lists_the_sessions_whose_id_starts_with_it_those_holding_only_events_too(sidecar: Sidecar) -> None:
    with CheckpointClient(sidecar.unix_target) as c:
        listed = [(s.session_id, s.head_version) for s in c.sessions(prefix="a/")]
        assert listed == [("a/1", 1), ("a/2", 1), ("a/3", 0)]
        assert [s.session_id for s in c.sessions(prefix="a")] == ["a", "a/1", "a/2", "a/3", "a0"]
        assert [s.session_id for s in c.sessions(prefix="z")] == ["z"]
        assert [s.session_id for s in c.sessions(prefix="a/1/")] == []
        assert [s.session_id for s in c.sessions(prefix="")] == sorted(WITH_CHECKPOINTS + EVENTS_ONLY)

    async def run() -> list[str]:
        async with AsyncCheckpointClient(sidecar.unix_target) as ac:
            return [s.session_id async for s in ac.sessions(prefix="a/", page_size=1)]

    assert asyncio.run(run()) == ["a/1", "a/2", "a/3"]


def test_a_prefix_narrows_the_label_and_update_time_filters_which_leave_out_events_only_sessions(
    sidecar: Sidecar,
) -> None:
    epoch = datetime.datetime.fromtimestamp(0, datetime.UTC)
    with CheckpointClient(sidecar.unix_target) as c:
        assert [s.session_id for s in c.sessions(labels={"team": "red"}, prefix="a")] == ["a", "a/1", "a0"]
        assert [s.session_id for s in c.sessions(labels={"team": "blue"}, prefix="a/")] == ["a/2"]
        assert [s.session_id for s in c.sessions(labels={"team": "blue"}, prefix="b")] == []
        by_time = [s.session_id for s in c.sessions(updated_after=epoch, prefix="a/")]
        assert sorted(by_time) == ["a/1", "a/2"]


def test_a_multibyte_prefix_matches_whole_characters_and_bytes_cutting_one_are_refused(sidecar: Sidecar) -> None:
    """The prefix "é" (C3 A9) matches ids starting with "é" only, not "ê" (C3 AA). A prefix of the byte C3
    alone (not UTF-8) cannot be a string: the sidecar refuses the request, and the client a lone surrogate."""
    with CheckpointClient(sidecar.unix_target) as c:
        assert [s.session_id for s in c.sessions(prefix="é")] == ["é1", "éa"]
        assert [s.session_id for s in c.sessions(prefix="ê")] == ["ê"]
        with pytest.raises(ValueError, match="prefix is not valid UTF-8: a lone surrogate"):
            next(c.sessions(prefix="\udcc3"))
    channel = grpc.insecure_channel(sidecar.unix_target)
    try:
        call = channel.unary_unary(
            "/ckpt.v1.CheckpointService/ListSessions",
            request_serializer=lambda raw: raw,
            response_deserializer=service_pb2.ListSessionsResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as refused:
            call(b"\x32\x01\xc3", timeout=10)  # field 6 (session_id_prefix), length 1: the byte C3
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "session_id_prefix is not UTF-8 (its bytes at offset 2)" in (refused.value.details() or "")
    finally:
        channel.close()


def test_pages_of_a_prefix_end_at_its_last_session_without_a_token(sidecar: Sidecar) -> None:
    channel, stub = _stub(sidecar)
    try:
        pages = []
        request = service_pb2.ListSessionsRequest(session_id_prefix="a/", page_size=1)
        while True:
            reply = stub.ListSessions(request, timeout=10)
            pages.append([s.session_id for s in reply.sessions])
            if not reply.next_page_token:
                break
            request.page_token = reply.next_page_token
        assert pages == [["a/1"], ["a/2"], ["a/3"]]  # the last page says so: "a0" and on are not read
        whole = stub.ListSessions(service_pb2.ListSessionsRequest(session_id_prefix="a/", page_size=3), timeout=10)
        assert [s.session_id for s in whole.sessions] == ["a/1", "a/2", "a/3"] and whole.next_page_token == ""
    finally:
        channel.close()


def test_a_token_resumes_only_a_listing_of_the_same_prefix(sidecar: Sidecar) -> None:
    channel, stub = _stub(sidecar)
    try:
        first = stub.ListSessions(service_pb2.ListSessionsRequest(session_id_prefix="a", page_size=1), timeout=10)
        unfiltered = stub.ListSessions(service_pb2.ListSessionsRequest(page_size=1), timeout=10)
        assert first.next_page_token and unfiltered.next_page_token
        for prefix, token in (
            ("b", first.next_page_token),
            ("", first.next_page_token),
            ("a", unfiltered.next_page_token),
        ):
            with pytest.raises(grpc.RpcError) as refused:
                stub.ListSessions(
                    service_pb2.ListSessionsRequest(session_id_prefix=prefix, page_size=1, page_token=token), timeout=10
                )
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "was issued for another listing" in (refused.value.details() or "")
        again = service_pb2.ListSessionsRequest(session_id_prefix="a", page_size=1, page_token=first.next_page_token)
        assert [s.session_id for s in stub.ListSessions(again, timeout=10).sessions] == ["a/1"]
    finally:
        channel.close()


def test_a_prefix_over_the_session_id_limit_or_with_a_control_character_is_refused_naming_the_field(
    sidecar: Sidecar,
) -> None:
    with CheckpointClient(sidecar.unix_target) as c:
        assert list(c.sessions(prefix="é" * 128)) == []  # 256 bytes: the limit, taken
        with pytest.raises(InvalidArgumentError, match=r"^session_id_prefix is 257 bytes; the limit is 256$"):
            next(c.sessions(prefix="a" + "é" * 128))
        with pytest.raises(InvalidArgumentError, match=r"^session_id_prefix 'a\\nb' contains an ASCII control"):
            next(c.sessions(prefix="a\nb"))
        with pytest.raises(TypeError, match=r"^prefix must be a str, not int$"):
            next(c.sessions(prefix=5))  # type: ignore[arg-type]
