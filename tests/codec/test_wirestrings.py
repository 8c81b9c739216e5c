"""invalid_utf8_field: the path and offset of the first string field that is not UTF-8, against the message's
descriptor, through nested messages, repeated fields and maps."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckpt.codec import invalid_utf8_field
from ckpt.v1 import checkpoint_pb2, service_pb2

BAD = b"\xff"


def _len(number: int, value: bytes) -> bytes:
    """A length-delimited field (its length under 128)."""
    assert len(value) < 128
    return bytes([number << 3 | 2, len(value)]) + value


AE = service_pb2.AppendEventsRequest.DESCRIPTOR
PUT = AE.fields_by_name["put"].number
LABELS = service_pb2.PutRequest.DESCRIPTOR.fields_by_name["labels"].number
EVENTS = AE.fields_by_name["events"].number
TYPE = AE.fields_by_name["events"].message_type.fields_by_name["type"].number  # type: ignore[union-attr]
PLAN = checkpoint_pb2.Checkpoint.DESCRIPTOR.fields_by_name["plan"].number
STEP_TITLE = checkpoint_pb2.PlanStep.DESCRIPTOR.fields_by_name["title"].number


@pytest.mark.parametrize(
    ("descriptor", "data", "found"),
    [
        (AE, _len(1, b"s" + BAD), ("session_id", 2)),
        (AE, _len(1, b"s") + _len(PUT, _len(LABELS, _len(1, BAD))), ("put.labels key", 9)),
        (AE, _len(PUT, _len(LABELS, _len(1, b"k") + _len(2, b"v" + BAD))), ("put.labels['k'] value", 9)),
        (AE, _len(EVENTS, _len(TYPE, b"a")) + _len(EVENTS, _len(TYPE, BAD)), ("events[1].type", 9)),
        (
            checkpoint_pb2.Checkpoint.DESCRIPTOR,
            _len(PLAN, _len(1, b"p1") + _len(2, _len(STEP_TITLE, b"x" + BAD))),
            ("plan['p1'].title", 10),
        ),
    ],
    ids=["top-level", "map-key-in-a-message", "map-value", "repeated-message", "map-of-messages"],
)
def test_the_first_string_that_is_not_utf8_is_named_with_the_offset_of_its_bytes(
    descriptor: object, data: bytes, found: tuple[str, int]
) -> None:
    assert invalid_utf8_field(data, descriptor) == found


@pytest.mark.parametrize(
    "data",
    [
        service_pb2.AppendEventsRequest(session_id="é", events=[service_pb2.Event(type="t")]).SerializeToString(),
        _len(1, b"s" + BAD)[:-1],  # cut short before the bad byte's field ends: not well-formed
        _len(15, BAD),  # a field the descriptor does not know is not a string of its
        bytes([8 | 0, 1]),  # a varint where session_id is: not a string's bytes
    ],
    ids=["well-formed", "truncated", "unknown-field", "other-wire-type"],
)
def test_none_when_no_known_string_field_is_bad(data: bytes) -> None:
    assert invalid_utf8_field(data, AE) is None


@given(st.lists(st.text(max_size=8), min_size=1, max_size=20), st.data())
def test_the_bad_event_found_is_the_one_spoiled(types: list[str], data: st.DataObject) -> None:
    spoiled = data.draw(st.integers(0, len(types) - 1))
    raw = b"".join(
        _len(EVENTS, _len(TYPE, BAD if i == spoiled else t.encode())) for i, t in enumerate(types)
    )  # a valid request but for that one
    found = invalid_utf8_field(raw, AE)
    assert found is not None and found[0] == f"events[{spoiled}].type"
    assert raw[found[1] : found[1] + 1] == BAD
    with pytest.raises(Exception, match="UTF-8"):  # the oracle: protobuf refuses it too
        service_pb2.AppendEventsRequest.FromString(raw)
