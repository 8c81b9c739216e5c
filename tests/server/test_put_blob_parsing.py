"""A PutBlob message parsed with its chunk left in place: what protobuf's own parser reads, without the copy."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckpt.sidecar.errors import InvalidArgument
from ckpt.sidecar.server.blobstreams import _parse_put_apart
from ckpt.v1 import service_pb2

_messages = st.builds(
    service_pb2.PutBlobRequest,
    session_id=st.text(max_size=20),
    media_type=st.text(max_size=20),
    expected_sha256=st.text(alphabet="0123456789abcdef", max_size=64),
    chunk=st.binary(max_size=300),
    end=st.booleans(),
)


@given(st.lists(_messages, min_size=1, max_size=3))
def test_reads_what_protobuf_reads_of_concatenated_messages(parts: list[service_pb2.PutBlobRequest]) -> None:
    # Concatenated messages merge: the last chunk wins, as for any singular field.
    raw = b"".join(p.SerializeToString() for p in parts)
    expected = service_pb2.PutBlobRequest.FromString(raw)
    message, chunk = _parse_put_apart(raw)
    assert bytes(chunk) == expected.chunk
    assert not message.chunk
    expected.ClearField("chunk")
    assert message == expected


def test_the_chunk_is_a_view_of_the_received_bytes() -> None:
    raw = service_pb2.PutBlobRequest(session_id="s", chunk=b"x" * 1000, end=True).SerializeToString()
    _, chunk = _parse_put_apart(raw)
    assert chunk.obj is raw


@pytest.mark.parametrize(
    ("raw", "chunk"),
    [
        (b"", b""),
        (bytes([0xA2, 0x00, 3]) + b"xyz", b"xyz"),  # the chunk's tag in two bytes, as a parser accepts
        (bytes([0x22, 0x83, 0x00]) + b"abc", b"abc"),  # its length in two
        (bytes([0x20, 0x05]), b""),  # field 4 as a varint: not the chunk, left to the parser
    ],
)
def test_boundary_encodings(raw: bytes, chunk: bytes) -> None:
    assert bytes(_parse_put_apart(raw)[1]) == chunk == service_pb2.PutBlobRequest.FromString(raw).chunk


@pytest.mark.parametrize(
    "raw",
    [
        bytes([0x22, 0x05]) + b"ab",  # a chunk cut short
        service_pb2.PutBlobRequest(chunk=b"ok").SerializeToString() + bytes([0x0A, 0x09]) + b"s",  # then a cut id
        bytes([0x0A]),  # a tag without its field
    ],
)
def test_malformed_bytes_name_the_type(raw: bytes) -> None:
    with pytest.raises(InvalidArgument, match=r"not a valid ckpt\.v1\.PutBlobRequest"):
        _parse_put_apart(raw)
