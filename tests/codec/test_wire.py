"""MERGE patches must be well-formed wire format; errors name the offset."""

from __future__ import annotations

import pytest
from hypothesis import given

from ckpt.codec import ChainEncoder, WireFormatError, check_patch
from ckpt.v1 import checkpoint_pb2 as pb
from tests.codec.strategies import checkpoints, serialize

BAD = [
    (b"\x08", 1, "truncated field 1 value varint at offset 1"),
    (b"\x08\x01\x80", 2, "truncated tag varint at offset 2"),
    (b"\x0a\x05ab", 0, "field 1 at offset 0 declares 5 bytes, 2 left"),
    (b"\x08\x01\x00\x01", 2, "field number 0 at offset 2"),  # upb's Empty would accept this
    (b"\x0f", 0, "invalid wire type 7 for field 1 at offset 0"),
    (b"\x0e", 0, "invalid wire type 6"),
    (b"\x0b\x10\x01", 0, "group of field 1 opened at offset 0 is never closed"),
    (b"\x0b\x10\x01\x14", 3, "unmatched end-group for field 2 at offset 3"),
    (b"\x0c", 0, "unmatched end-group for field 1"),
    (b"\x09\x01\x02\x03", 0, "field 1 at offset 0 needs 8 bytes, 3 left"),
    (b"\x0d\x01", 0, "needs 4 bytes, 1 left"),
    (b"\x08" + b"\xff" * 10 + b"\x01", 1, "longer than 10 bytes"),
]
GOOD = [b"", b"\x08\x01", b"\x0b\x10\x01\x0c", b"\x0b\x13\x14\x0c", b"\x0a\x00", b"\x09" + b"\x00" * 8]


@pytest.mark.parametrize(("patch", "offset", "message"), BAD, ids=lambda x: repr(x)[:24])
def test_malformed_patches_name_the_offset(patch: bytes, offset: int, message: str) -> None:
    with pytest.raises(WireFormatError, match=message) as info:
        check_patch(patch)
    assert info.value.offset == offset


@pytest.mark.parametrize("patch", GOOD, ids=repr)
def test_well_formed_patches_pass(patch: bytes) -> None:
    check_patch(patch)


@given(checkpoints(partial=True))
def test_every_serialized_checkpoint_is_a_valid_patch(cp: pb.Checkpoint) -> None:
    check_patch(serialize(cp), message_type=pb.Checkpoint)


def test_schema_check_catches_nested_damage() -> None:
    # Top level fine (field 16, 1 byte), but the nested Message is malformed.
    patch = b"\x82\x01\x01\x08"
    check_patch(patch)
    with pytest.raises(WireFormatError, match=r"does not parse as ckpt\.v1\.Checkpoint"):
        check_patch(patch, message_type=pb.Checkpoint)


def test_a_refused_patch_changes_nothing() -> None:
    enc = ChainEncoder()
    enc.merge(b"\x08\x01")
    before = (enc.version, enc.state, enc.chain)
    with pytest.raises(WireFormatError):
        enc.merge(b"\x0a\x05ab")
    assert (enc.version, enc.state, enc.chain) == before
    assert enc.merge(b"\x08\x02").version == 2
