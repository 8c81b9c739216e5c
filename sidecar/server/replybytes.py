"""Replies that carry states, encoded with each state spliced in rather than serialized by protobuf.

upb's ``SerializeToString`` copies a large bytes field at ~0.6-0.7 GB/s on this
project's VM: a GetResponse of a 300 KB state took ~440 us to serialize, one of
10 MB ~21 ms, against ~15 us and ~0.9 ms for the same bytes joined here. So a
reply's small fields are serialized by protobuf, and the state's field
(length-delimited: its tag, its length, its bytes) is joined between them in
field-number order: the result is byte for byte the encoding protobuf would
give (tests/server/test_reply_bytes.py holds it to that).
"""

from __future__ import annotations

from collections.abc import Sequence

from ckpt.v1 import service_pb2

from ..store.types import GetResult, VersionInfo
from .convert import version_info_pb

# Field numbers (proto/ckpt/v1/service.proto), each checked against the descriptor below.
_GET_VERSION, _GET_STATE = 1, 2
_INFO_STATE = 9
_LIST_VERSIONS = 1
_LENGTH_DELIMITED = 2


def _check_fields() -> None:
    # A renumbered field would make these encodings wrong, not merely slower: fail at import.
    fields = service_pb2.GetResponse.DESCRIPTOR.fields_by_name
    info = service_pb2.VersionInfo.DESCRIPTOR.fields_by_name
    listed = service_pb2.ListVersionsResponse.DESCRIPTOR.fields_by_name
    others = [f.number for f in service_pb2.GetResponse.DESCRIPTOR.fields if f.name != "version"]
    if not (
        fields["version"].number == _GET_VERSION
        and fields["state"].number == _GET_STATE == min(others)
        and info["state"].number == _INFO_STATE == max(f.number for f in service_pb2.VersionInfo.DESCRIPTOR.fields)
        and listed["versions"].number == _LIST_VERSIONS
        and max(f.number for f in service_pb2.ListVersionsResponse.DESCRIPTOR.fields) == _LIST_VERSIONS + 1
    ):
        raise ImportError("replybytes.py's field numbers no longer match proto/ckpt/v1/service.proto")


_check_fields()


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _bytes_field(number: int, data: bytes) -> list[bytes]:
    """The pieces of a length-delimited field (none for empty bytes: proto3 leaves it out)."""
    if not data:
        return []
    return [_varint(number << 3 | _LENGTH_DELIMITED), _varint(len(data)), data]


def get_response_bytes(got: GetResult) -> bytes:
    """The GetResponse of ``got``, whichever process read it (the store process, or the gRPC process's own
    read): its version, state, info and message type."""
    head = _varint(_GET_VERSION << 3) + _varint(got.version) if got.version else b""
    info = got.info
    rest = service_pb2.GetResponse(info=version_info_pb(info), message_type=info.message_type).SerializeToString()
    return b"".join((head, *_bytes_field(_GET_STATE, got.state), rest))


def version_with_state_bytes(info: VersionInfo, state: bytes) -> bytes:
    """``convert.version_info_pb(info)`` with ``state`` set, encoded (the state is its last field)."""
    return b"".join((version_info_pb(info).SerializeToString(), *_bytes_field(_INFO_STATE, state)))


def list_versions_bytes(versions: Sequence[tuple[VersionInfo, bytes]], next_page_token: str) -> bytes:
    """The encoding of a ListVersionsResponse of ``versions`` (each with its state) and the token."""
    tag = _varint(_LIST_VERSIONS << 3 | _LENGTH_DELIMITED)
    pieces: list[bytes] = []
    for info, state in versions:
        encoded = version_with_state_bytes(info, state)
        pieces += (tag, _varint(len(encoded)), encoded)
    if next_page_token:
        pieces.append(service_pb2.ListVersionsResponse(next_page_token=next_page_token).SerializeToString())
    return b"".join(pieces)
