"""Requests the sidecar cannot use get INVALID_ARGUMENT, not UNKNOWN or INTERNAL.

Malformed bytes are sent as they would arrive from a buggy client: raw, through
a channel without serializers, to a real `ckpt serve` process.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from ckpt.codec import count_fields
from ckpt.sidecar.config import MAX_STREAM_BATCH_PUTS
from ckpt.sidecar.errors import InvalidArgument
from ckpt.sidecar.server.convert import labels_arg, put_request
from ckpt.sidecar.server.failures import MAX_DETAILS_BYTES, bounded_details
from ckpt.v1 import service_pb2, service_pb2_grpc
from tests.support import Sidecar, start_sidecar

SERVICE = "/ckpt.v1.CheckpointService/"
MAX_TIME_NANOS = 2**64 - 1  # the store keys times as unsigned 64-bit nanoseconds


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    s = start_sidecar(tmp_path_factory.mktemp("bad-requests") / "data")
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture
def channel(sidecar: Sidecar) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(sidecar.unix_target) as ch:
        yield ch
    assert sidecar.process.poll() is None, sidecar.log()


def field_bytes(number: int, value: bytes) -> bytes:
    """One length-delimited field in protobuf wire format (value shorter than 128 bytes)."""
    assert len(value) < 128
    return bytes([number << 3 | 2, len(value)]) + value


BAD_UTF8_SESSION_ID = field_bytes(1, b"s-\xff\xfe")  # session_id is field 1 of every request below


def truncated(message: Any) -> bytes:
    return bytes(message.SerializeToString()[:-1])


def assert_serves(channel: grpc.Channel) -> None:
    stub = service_pb2_grpc.CheckpointServiceStub(channel)
    put = stub.Put(service_pb2.PutRequest(session_id="good", state=b"state"), timeout=10)
    got = stub.Get(service_pb2.GetRequest(session_id="good", version=put.version), timeout=10)
    assert got.state == b"state"


def assert_invalid(info: pytest.ExceptionInfo[grpc.RpcError], *parts: str) -> None:
    err: Any = info.value
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details())
    for part in parts:
        assert part in err.details()


UNARY = [
    ("Put", service_pb2.PutRequest(session_id="session", state=b"state")),
    ("Get", service_pb2.GetRequest(session_id="session")),
    ("ListVersions", service_pb2.ListVersionsRequest(session_id="session")),
]


@pytest.mark.parametrize("corruption", ["bad-utf8", "truncated"])
@pytest.mark.parametrize(("method", "valid"), UNARY, ids=[m for m, _ in UNARY])
def test_a_malformed_unary_request_is_invalid_argument(
    channel: grpc.Channel, method: str, valid: Any, corruption: str
) -> None:
    raw = BAD_UTF8_SESSION_ID if corruption == "bad-utf8" else truncated(valid)
    call = channel.unary_unary(SERVICE + method)  # no serializers: bytes in, bytes out
    with pytest.raises(grpc.RpcError) as info:
        call(raw, timeout=10)
    expected = "UTF-8" if corruption == "bad-utf8" else ""
    assert_invalid(info, f"not a valid {valid.DESCRIPTOR.full_name}", expected)
    assert_serves(channel)


_LABELS = service_pb2.PutRequest.DESCRIPTOR.fields_by_name["labels"].number
_EVENTS = service_pb2.AppendEventsRequest.DESCRIPTOR.fields_by_name["events"].number
_EVENT_TYPE = (
    service_pb2.AppendEventsRequest.DESCRIPTOR.fields_by_name["events"].message_type.fields_by_name["type"].number  # type: ignore[union-attr]
)
_PREFIX = service_pb2.ListSessionsRequest.DESCRIPTOR.fields_by_name["session_id_prefix"].number


# protobuf's own message ("String field had bad UTF-8") named no field; a client whose runtime does not
# check strings (or that builds bytes) had to guess which.
@pytest.mark.parametrize(
    ("method", "raw", "named"),
    [
        ("Put", BAD_UTF8_SESSION_ID, "session_id is not UTF-8 (its bytes at offset 2)"),
        ("Put", field_bytes(1, b"s") + field_bytes(_LABELS, field_bytes(1, b"k\xff")), "labels key is not UTF-8"),
        (
            "Put",
            field_bytes(1, b"s") + field_bytes(_LABELS, field_bytes(1, b"k") + field_bytes(2, b"\xc3")),
            "labels['k'] value is not UTF-8 (its bytes at offset 10)",
        ),
        (
            "AppendEvents",
            field_bytes(1, b"s")
            + field_bytes(_EVENTS, field_bytes(_EVENT_TYPE, b"ok"))
            + field_bytes(_EVENTS, field_bytes(_EVENT_TYPE, b"\xe2\x82")),
            "events[1].type is not UTF-8",
        ),
        ("ListSessions", field_bytes(_PREFIX, "agent-é".encode()[:-1]), "session_id_prefix is not UTF-8"),
    ],
    ids=["session-id", "labels-key", "labels-value", "event-type", "prefix-cut-in-a-character"],
)
def test_a_string_that_is_not_utf8_is_named_with_its_offset(
    channel: grpc.Channel, method: str, raw: bytes, named: str
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        channel.unary_unary(SERVICE + method)(raw, timeout=10)
    assert_invalid(info, f"the request is not a valid ckpt.v1.{method}Request: {named}")
    assert_serves(channel)


@pytest.mark.parametrize("corruption", ["bad-utf8", "truncated"])
def test_a_malformed_stream_message_ends_the_stream_with_invalid_argument(
    channel: grpc.Channel, corruption: str
) -> None:
    good = service_pb2.PutStreamRequest(
        batch_id=1, puts=[service_pb2.PutRequest(session_id=f"stream-{corruption}", state=b"first")]
    )
    puts_field = service_pb2.PutStreamRequest.DESCRIPTOR.fields_by_name["puts"].number
    bad = field_bytes(puts_field, BAD_UTF8_SESSION_ID) if corruption == "bad-utf8" else truncated(good)
    call = channel.stream_stream(SERVICE + "PutStream")
    answers = []
    with pytest.raises(grpc.RpcError) as info:
        for raw in call(iter([good.SerializeToString(), bad]), timeout=10):
            answers.append(service_pb2.PutStreamResponse.FromString(raw))
    assert_invalid(info, "not a valid ckpt.v1.PutStreamRequest")
    # The batch before the malformed one was written and answered.
    assert [(a.batch_id, [r.response.version for r in a.results]) for a in answers] == [(1, [1])]
    stub = service_pb2_grpc.CheckpointServiceStub(channel)
    assert stub.Get(service_pb2.GetRequest(session_id=f"stream-{corruption}"), timeout=10).state == b"first"
    assert_serves(channel)


def timestamp(seconds: int, nanos: int = 0) -> Timestamp:
    return Timestamp(seconds=seconds, nanos=nanos)


YEAR_9999 = 253402300799  # 9999-12-31T23:59:59Z, the latest valid Timestamp


@pytest.mark.parametrize("labels", [{}, {"team": "a"}], ids=["time-index", "label-index"])
@pytest.mark.parametrize(
    ("field", "ts"),
    [
        ("updated_before", timestamp(YEAR_9999)),
        ("updated_after", timestamp(YEAR_9999)),
        ("updated_before", timestamp(MAX_TIME_NANOS // 10**9 + 1)),  # a second past the last time
        ("updated_after", timestamp(0, -1)),
        ("updated_before", timestamp(0, 10**9)),
        ("updated_after", timestamp(-62135596801)),  # before 0001-01-01, protobuf's earliest
    ],
    ids=["before-9999", "after-9999", "before-past-2**64ns", "after-nanos-1", "before-nanos-1e9", "after-year-0"],
)
def test_list_sessions_rejects_times_the_store_cannot_hold(
    channel: grpc.Channel, field: str, ts: Timestamp, labels: dict[str, str]
) -> None:
    stub = service_pb2_grpc.CheckpointServiceStub(channel)
    request = service_pb2.ListSessionsRequest(label_filter=labels)
    getattr(request, field).CopyFrom(ts)
    with pytest.raises(grpc.RpcError) as info:
        stub.ListSessions(request, timeout=10)
    assert_invalid(info, field, "2554-07-21T23:34:33.709551615Z", "0..999,999,999")
    assert_serves(channel)


@pytest.mark.parametrize("labels", [{}, {"team": "a"}], ids=["time-index", "label-index"])
def test_list_sessions_refuses_updated_after_later_than_updated_before(
    channel: grpc.Channel, labels: dict[str, str]
) -> None:
    """Swapped bounds listed nothing, silently; an empty range of equal bounds still lists nothing."""
    stub = service_pb2_grpc.CheckpointServiceStub(channel)
    stub.Put(service_pb2.PutRequest(session_id="swapped", state=b"x", labels=labels), timeout=10)
    request = service_pb2.ListSessionsRequest(
        label_filter=labels, updated_after=timestamp(2_000_000_000), updated_before=timestamp(1_000_000_000)
    )
    with pytest.raises(grpc.RpcError) as info:
        stub.ListSessions(request, timeout=10)
    assert_invalid(info, "updated_after (2000000000000000000 ns) is later than updated_before (1000000000000000000 ns)")
    equal = service_pb2.ListSessionsRequest(
        label_filter=labels, updated_after=timestamp(1_000_000_000), updated_before=timestamp(1_000_000_000)
    )
    assert list(stub.ListSessions(equal, timeout=10).sessions) == []
    assert_serves(channel)


def test_list_sessions_accepts_the_whole_range(channel: grpc.Channel) -> None:
    stub = service_pb2_grpc.CheckpointServiceStub(channel)
    stub.Put(service_pb2.PutRequest(session_id="in-range", state=b"x"), timeout=10)
    last = Timestamp()
    last.FromNanoseconds(MAX_TIME_NANOS)
    everything = service_pb2.ListSessionsRequest(
        updated_after=timestamp(-62135596800), updated_before=last, page_size=1000
    )
    assert "in-range" in {s.session_id for s in stub.ListSessions(everything, timeout=10).sessions}
    # Times before the Unix epoch are earlier than every update.
    none = service_pb2.ListSessionsRequest(updated_before=timestamp(-1))
    assert not stub.ListSessions(none, timeout=10).sessions


def _head_trailer(err: Any) -> str | None:
    return dict(err.trailing_metadata() or ()).get("ckpt-current-version")


@pytest.mark.parametrize("expected_version", [2**63 - 1, 2**63, 2**64 - 1])
@pytest.mark.parametrize("request_id", ["", "rid-past-int64"], ids=["no-request-id", "request-id"])
def test_an_expected_version_past_the_head_is_a_conflict_up_to_uint64(
    channel: grpc.Channel, expected_version: int, request_id: str
) -> None:
    """expected_version is a uint64: past int64 it was hashed as a signed number for the request-id
    check, so such a Put (every client call sets a request id) got INTERNAL instead of ABORTED."""
    stub = service_pb2_grpc.CheckpointServiceStub(channel)
    session = f"ev-{expected_version}-{bool(request_id)}"
    stub.Put(service_pb2.PutRequest(session_id=session, state=b"one"), timeout=10)
    put = service_pb2.PutRequest(
        session_id=session, state=b"two", expected_version=expected_version, request_id=request_id
    )
    for _ in range(2):  # and its retry: nothing was written, so nothing is replayed
        with pytest.raises(grpc.RpcError) as info:
            stub.Put(put, timeout=10)
        err: Any = info.value
        assert err.code() is grpc.StatusCode.ABORTED, (err.code(), err.details())
        assert f"expected_version {expected_version} but the head is version 1" in err.details()
        assert _head_trailer(err) == "1"
    assert stub.Get(service_pb2.GetRequest(session_id=session), timeout=10).state == b"one"


def test_a_request_id_reused_with_expected_version_uint64_max_is_another_write(channel: grpc.Channel) -> None:
    """A write without expected_version hashes the mode and -1 as int64: the same bytes as 2**64-1
    as a uint64. The retry asking for 2**64-1 must not replay the write made without one."""
    stub = service_pb2_grpc.CheckpointServiceStub(channel)
    first = stub.Put(service_pb2.PutRequest(session_id="ev-max", state=b"one", request_id="r1"), timeout=10)
    assert first.version == 1 and not first.replayed
    with pytest.raises(grpc.RpcError) as info:
        stub.Put(
            service_pb2.PutRequest(session_id="ev-max", state=b"one", request_id="r1", expected_version=2**64 - 1),
            timeout=10,
        )
    assert_invalid(info, "request_id 'r1' was used for a different write")


def test_a_stream_write_past_int64_fails_alone(channel: grpc.Channel) -> None:
    """It used to end the stream UNKNOWN: the write before it committed unanswered, the ones after were dropped."""
    stub = service_pb2_grpc.CheckpointServiceStub(channel)
    batches = [
        service_pb2.PutStreamRequest(
            batch_id=1,
            puts=[
                service_pb2.PutRequest(session_id="ev-stream", state=b"one", request_id="e1"),
                service_pb2.PutRequest(session_id="ev-stream", state=b"x", request_id="e2", expected_version=2**63),
                service_pb2.PutRequest(session_id="ev-stream", state=b"three", request_id="e3"),
            ],
        ),
        service_pb2.PutStreamRequest(
            batch_id=2, puts=[service_pb2.PutRequest(session_id="ev-stream", state=b"four", request_id="e4")]
        ),
    ]
    answers = list(stub.PutStream(iter(batches), timeout=10))
    assert [a.batch_id for a in answers] == [1, 2]
    one, conflict, three = answers[0].results
    assert one.response.version == 1 and three.response.version == 2
    assert conflict.error.code == grpc.StatusCode.ABORTED.value[0] and conflict.error.current_version == 1
    assert f"expected_version {2**63} but the head is version 1" in conflict.error.message
    assert answers[1].results[0].response.version == 3


def test_a_page_token_of_another_listing_is_invalid_argument(channel: grpc.Channel) -> None:
    """It used to resume the other listing part-way, ending with an empty next token."""
    stub = service_pb2_grpc.CheckpointServiceStub(channel)
    for session, versions in (("tok-a", 10), ("tok-b", 4)):
        for v in range(versions):
            stub.Put(service_pb2.PutRequest(session_id=session, state=bytes([8, v])), timeout=10)
    token_b = stub.ListVersions(service_pb2.ListVersionsRequest(session_id="tok-b", page_size=1), timeout=10)
    with pytest.raises(grpc.RpcError) as info:
        stub.ListVersions(
            service_pb2.ListVersionsRequest(session_id="tok-a", page_token=token_b.next_page_token), timeout=10
        )
    assert_invalid(info, "was issued for another listing")
    assert_serves(channel)


# A string a client sent, quoted whole in an error, made the status's details as large as the
# string: past 16 KiB every gRPC client refused them (RESOURCE_EXHAUSTED "received metadata size
# exceeds hard limit" instead of INVALID_ARGUMENT), and past a message's size the store process's
# reply could not cross the link: the sidecar stopped (exit 1) on one ListVersions.
HUGE = 100_000


def _huge_requests() -> list[tuple[str, str, bytes]]:
    key = "k" * HUGE
    return [
        (
            "Put",
            "labels key",
            service_pb2.PutRequest(session_id="huge", state=b"x", labels={key: "v"}).SerializeToString(),
        ),
        (
            "Fork",
            "labels key",
            service_pb2.ForkRequest(
                session_id="huge", new_session_id="huge-fork", labels={key: "v"}
            ).SerializeToString(),
        ),
        (
            "ListSessions",
            "label_filter key",
            service_pb2.ListSessionsRequest(label_filter={key: "v"}).SerializeToString(),
        ),
        ("ListSessions", "page_token", service_pb2.ListSessionsRequest(page_token="A" * HUGE).SerializeToString()),
        (
            "ListVersions",
            "page_token",
            service_pb2.ListVersionsRequest(session_id="huge", page_token="A" * HUGE).SerializeToString(),
        ),
    ]


def _assert_short_invalid(channel: grpc.Channel, method: str, field: str, raw: bytes) -> None:
    with pytest.raises(grpc.RpcError) as info:
        channel.unary_unary(SERVICE + method)(raw, timeout=30)
    assert_invalid(info, field)
    details: str = info.value.details()
    assert len(details.encode()) < 1000, details[:200]


def test_an_error_quotes_a_huge_string_cut_short(tmp_path: Any) -> None:
    s = start_sidecar(tmp_path / "data")
    try:
        with grpc.insecure_channel(s.unix_target) as channel:
            stub = service_pb2_grpc.CheckpointServiceStub(channel)
            stub.Put(service_pb2.PutRequest(session_id="huge", state=b"x"), timeout=10)
            for method, field, raw in _huge_requests():
                _assert_short_invalid(channel, method, field, raw)
            # Its "is 100000 bytes" names the size and the limit, the key's start shown.
            with pytest.raises(grpc.RpcError) as info:
                stub.Put(service_pb2.PutRequest(session_id="huge", state=b"x", labels={"k" * HUGE: "v"}), timeout=10)
            assert_invalid(info, "'kkkk", f"({HUGE} characters) is {HUGE} bytes; it must be 1-63")
            # On a stream, the write fails alone with a short message and the others are answered.
            batch = service_pb2.PutStreamRequest(
                batch_id=7,
                puts=[
                    service_pb2.PutRequest(session_id="huge", state=b"y", labels={"\x01" * HUGE: "v"}),
                    service_pb2.PutRequest(session_id="huge", state=b"z"),
                ],
            )
            (answer,) = stub.PutStream(iter([batch]), timeout=30)
            bad, good = answer.results
            assert bad.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
            assert "labels key" in bad.error.message and len(bad.error.message) < 1000
            assert good.response.version == 2
            assert_serves(channel)
        assert s.process.poll() is None, s.log()
    finally:
        assert s.stop() == 0, s.log()


def test_a_page_token_of_megabytes_does_not_stop_the_sidecar(channel: grpc.Channel) -> None:
    """Its error, quoting it whole (5x as JSON), was a link frame over the gRPC process's limit."""
    stub = service_pb2_grpc.CheckpointServiceStub(channel)
    stub.Put(service_pb2.PutRequest(session_id="mb-token", state=b"x"), timeout=10)
    raw = service_pb2.ListVersionsRequest(session_id="mb-token", page_token="\x01" * 14_000_000).SerializeToString()
    _assert_short_invalid(channel, "ListVersions", "page_token", raw)
    assert_serves(channel)


@pytest.mark.parametrize("char", ["a", "\u00e9", "\U0001f600"])
def test_status_details_are_bounded_whatever_quotes_what(char: str) -> None:
    """The last guard: any error quoting a client's string whole still fits a header and the link."""
    assert bounded_details("short") == "short"
    text = "error: " + char * 10_000
    cut = bounded_details(text)
    assert cut.startswith("error: " + char * 100)
    assert len(cut.encode()) <= MAX_DETAILS_BYTES + 40
    assert cut.endswith(f"... (cut: {len(text.encode())} bytes)")


def test_a_stream_message_of_too_many_writes_ends_the_stream(tmp_path: Any) -> None:
    """Each write of a message cost ~2-4 KB under way, whatever its size: a 400 KB message of 200,000
    empty writes took 770 MB (answered with 12 MB), so one of 64 MiB would have taken ~120 GB. A message
    of more than MAX_STREAM_BATCH_PUTS writes is refused, unparsed; the batches before it are answered."""
    s = start_sidecar(tmp_path / "data")
    try:
        with grpc.insecure_channel(s.unix_target) as channel:
            at_limit = service_pb2.PutStreamRequest(
                batch_id=1, puts=[service_pb2.PutRequest(session_id="many", state=b"")] * MAX_STREAM_BATCH_PUTS
            ).SerializeToString()
            one_past = service_pb2.PutRequest(session_id="many").SerializeToString()
            too_many = b"".join([bytes([0x0A, len(one_past)]) + one_past] * (MAX_STREAM_BATCH_PUTS + 1))
            empty_writes = b"\x0a\x00" * 1_000_000  # 2 MB, a million writes
            for past in (too_many, empty_writes):
                answers = []
                with pytest.raises(grpc.RpcError) as info:
                    for raw in channel.stream_stream(SERVICE + "PutStream")(iter([at_limit, past]), timeout=60):
                        answers.append(service_pb2.PutStreamResponse.FromString(raw))
                assert_invalid(info, f"puts has more than {MAX_STREAM_BATCH_PUTS} entries")
                assert [(a.batch_id, len(a.results)) for a in answers] == [(1, MAX_STREAM_BATCH_PUTS)]
            stub = service_pb2_grpc.CheckpointServiceStub(channel)
            head = stub.ListVersions(service_pb2.ListVersionsRequest(session_id="many", page_size=1), timeout=10)
            assert head.versions[0].version == 2 * MAX_STREAM_BATCH_PUTS  # the two batches at the limit
            assert_serves(channel)
        assert s.process.poll() is None, s.log()
    finally:
        assert s.stop() == 0, s.log()


def test_the_writes_of_a_stream_message_are_counted_as_the_parser_reads_them() -> None:
    """Unknown fields, a non-minimal tag and a group holding field-1 entries are no writes; the
    count stops at its bound; wire format it cannot read ends it (the parser then names the fault)."""
    put = b"\x0a\x00"
    assert count_fields(put * 5, 1, stop=100) == 5
    assert count_fields(put * 5, 1, stop=3) == 3
    mixed = b"\x10\x07" + put + b"\x19" + bytes(8) + put + b"\x25" + bytes(4) + b"\x8a\x00\x00"
    assert count_fields(mixed, 1, stop=100) == 3
    assert count_fields(b"\x1b" + put * 10 + b"\x1c" + put, 1, stop=100) == 1  # field 3 as a group
    assert count_fields(put + b"\x0a\x80", 1, stop=100) == 1  # a length cut short
    assert count_fields(put + b"\x0e" + put, 1, stop=100) == 1  # wire type 6


@pytest.mark.parametrize(
    "request_type", [service_pb2.PutRequest, service_pb2.ForkRequest, service_pb2.ListSessionsRequest]
)
def test_too_many_labels_are_refused_before_they_are_copied(request_type: Any) -> None:
    """A Put of a million labels (10 MB) was copied to a dict, 126 MB and 0.65 s of the event loop,
    before the count was checked. Refused as before, naming the limit, without the copy."""
    field = "label_filter" if request_type is service_pb2.ListSessionsRequest else "labels"
    message = request_type()
    getattr(message, field).update({str(i): "" for i in range(20_000)})
    tracemalloc.start()
    try:
        with pytest.raises(InvalidArgument, match=f"{field} has 20000 entries; the limit is 64"):
            labels_arg(getattr(message, field), field)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024, peak
    if request_type is service_pb2.PutRequest:
        with pytest.raises(InvalidArgument, match="labels has 20000 entries"):
            put_request(message)
