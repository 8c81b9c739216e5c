"""A msgpack array cut into its values' bytes (sidecar/langgraph/msgpacksplit.py): every kind of value, the
array headers of every width, and bytes that are not one whole array, each refused naming the offset."""

from __future__ import annotations

import re
from typing import Any

import ormsgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from ckpt.sidecar.langgraph.msgpacksplit import MsgpackSplitError, split_array

# One value of each kind, its bytes as msgpack's spec writes them: first byte, then the rest.
VALUES: list[tuple[str, bytes]] = [
    ("positive fixint", b"\x7f"),
    ("negative fixint", b"\xe0"),
    ("fixmap", b"\x81\xa1k\x01"),
    ("fixarray", b"\x92\x01\x02"),
    ("empty fixarray", b"\x90"),
    ("fixstr", b"\xa3abc"),
    ("nil", b"\xc0"),
    ("false", b"\xc2"),
    ("true", b"\xc3"),
    ("bin 8", b"\xc4\x02ab"),
    ("bin 16", b"\xc5\x00\x02ab"),
    ("bin 32", b"\xc6\x00\x00\x00\x02ab"),
    ("ext 8", b"\xc7\x02\x05ab"),
    ("ext 16", b"\xc8\x00\x02\x05ab"),
    ("ext 32", b"\xc9\x00\x00\x00\x02\x05ab"),
    ("float 32", b"\xca" + bytes(4)),
    ("float 64", b"\xcb" + bytes(8)),
    ("uint 8", b"\xcc\xff"),
    ("uint 16", b"\xcd" + bytes(2)),
    ("uint 32", b"\xce" + bytes(4)),
    ("uint 64", b"\xcf" + bytes(8)),
    ("int 8", b"\xd0\x80"),
    ("int 16", b"\xd1" + bytes(2)),
    ("int 32", b"\xd2" + bytes(4)),
    ("int 64", b"\xd3" + bytes(8)),
    ("fixext 1", b"\xd4\x05" + bytes(1)),
    ("fixext 2", b"\xd5\x05" + bytes(2)),
    ("fixext 4", b"\xd6\x05" + bytes(4)),
    ("fixext 8", b"\xd7\x05" + bytes(8)),
    ("fixext 16", b"\xd8\x05" + bytes(16)),
    ("str 8", b"\xd9\x02ab"),
    ("str 16", b"\xda\x00\x02ab"),
    ("str 32", b"\xdb\x00\x00\x00\x02ab"),
    ("array 16", b"\xdc\x00\x02\xc0\xa1x"),
    ("array 32", b"\xdd\x00\x00\x00\x01\x92\x01\x02"),
    ("map 16", b"\xde\x00\x01\xa1k\x92\x01\x02"),
    ("map 32", b"\xdf\x00\x00\x00\x01\xa1k\x81\xa1j\x03"),
]


@pytest.mark.parametrize(("kind", "value"), VALUES, ids=[kind for kind, _ in VALUES])
def test_each_kind_of_value_is_cut_whole(kind: str, value: bytes) -> None:
    ormsgpack.unpackb(value, ext_hook=lambda tag, data: (tag, data))  # one value, as msgpack reads it
    data = b"\x93\x01" + value + b"\xa1z"
    assert split_array(data) == [b"\x01", value, b"\xa1z"]


@pytest.mark.parametrize(
    "header", [b"\x90", b"\x9f", b"\xdc\x00\x00", b"\xdc\xff\xff", b"\xdd\x00\x01\x00\x00"], ids=bytes.hex
)
def test_every_array_header_is_read(header: bytes) -> None:
    count = header[0] & 0x0F if header[0] < 0xDC else int.from_bytes(header[1:], "big")
    assert split_array(header + b"\xc0" * count) == [b"\xc0"] * count


def test_the_elements_of_a_serialized_conversation_are_those_serialized_alone() -> None:
    serde = JsonPlusSerializer()
    values: list[Any] = [
        HumanMessage(content="hello", id="h"),
        AIMessage(content="", id="a", tool_calls=[{"name": "ls", "args": {"p": "/"}, "id": "c"}]),
        {"nested": [1, 2.5, "x" * 300, {"deep": [True, -(2**40)]}]},
        "y" * 70_000,
    ]
    _, whole = serde.dumps_typed(values)
    assert split_array(whole) == [serde.dumps_typed(v)[1] for v in values]


def _error(data: bytes) -> str:
    with pytest.raises(MsgpackSplitError) as caught:
        split_array(data)
    return str(caught.value)


@pytest.mark.parametrize(("kind", "value"), VALUES, ids=[kind for kind, _ in VALUES])
def test_an_array_cut_short_anywhere_is_refused(kind: str, value: bytes) -> None:
    data = b"\x92" + value + b"\xa1z"
    for end in range(len(data)):
        message = _error(data[:end])
        assert re.search(r"offset \d+|no bytes|header", message), message


def test_bytes_after_the_array_are_refused_naming_their_offset() -> None:
    assert _error(b"\x91\x01\x02\x03") == "2 bytes follow the array's 1 values, at offset 2"


def test_a_byte_that_begins_no_value_is_refused_naming_its_offset() -> None:
    assert _error(b"\x92\x01\xc1") == "byte 0xc1 at offset 2 begins no msgpack value"


@pytest.mark.parametrize("data", [b"\x01", b"\x81\x01\x02", b"\xa1a", b"\xdc\x00"], ids=bytes.hex)
def test_what_is_no_array_is_refused(data: bytes) -> None:
    assert "not a msgpack array header at offset 0" in _error(data)


_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.floats(width=32, allow_nan=False),
    st.text(max_size=300),
    st.binary(max_size=300),
    st.builds(ormsgpack.Ext, st.integers(min_value=0, max_value=127), st.binary(max_size=300)),
)
_value = st.recursive(
    _leaf,
    lambda inner: st.lists(inner, max_size=20) | st.dictionaries(st.text(max_size=8), inner, max_size=20),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None)
@given(values=st.lists(_value, max_size=40))
def test_split_gives_each_value_as_msgpack_packs_it_alone(values: list[Any]) -> None:
    data = ormsgpack.packb(values)
    assert split_array(data) == [ormsgpack.packb(v) for v in values]


@settings(max_examples=300, deadline=None)
@given(values=st.lists(_value, min_size=1, max_size=10), data=st.data())
def test_a_flipped_byte_is_refused_or_cut_into_as_many_bytes(values: list[Any], data: Any) -> None:
    packed = bytearray(ormsgpack.packb(values))
    at = data.draw(st.integers(min_value=0, max_value=len(packed) - 1))
    packed[at] ^= 1 << data.draw(st.integers(min_value=0, max_value=7))
    try:
        parts = split_array(bytes(packed))
    except MsgpackSplitError:
        return
    assert b"".join(parts) == bytes(packed)[len(packed) - sum(map(len, parts)) :]
