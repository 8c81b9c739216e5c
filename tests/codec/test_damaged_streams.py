"""A stream's zstd frame as FORMAT.md §4 bounds it: its window is the header's window_log, it never ends,
and every read path refuses one that breaks either rule, naming the version. A damaged payload is named
the same by decode (after its one-pass read fails) as by iter_versions."""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import xxhash

from ckpt.codec import (
    READABLE_FORMATS,
    CodecError,
    DecodeError,
    decode,
    iter_versions,
    open_chain,
    parse,
)
from tests.codec.layout import PATCH, is_v2, payload_of, v2_fields, with_checksum, with_fields
from tests.codec.test_codec_hostile import CHAINS
from tests.codec.test_format_doc import FormatError, hydrate, read_versions
from tests.golden.cases import Case, _cp, _patch, run

FORMAT_MD = Path(__file__).parents[2] / "codec" / "FORMAT.md"
# §7's frames 1 and 2 (format 1), then §11's (format 2): "hello " * 1000, then 08 01 appended.
V1_FULL, V1_PATCH, V2_FULL, V2_PATCH = (
    bytes.fromhex(block) for block in re.findall(r"```\n([0-9a-f]+)\n```", FORMAT_MD.read_text())[:4]
)
STATE = b"hello " * 1000

# Golden damage vectors: the worked examples' frames with their zstd frame changed, checksums recomputed.
# The zstd Window_Descriptor (payload byte 5) 0x30 -> 0x88: a 2**27-byte window; the header still says 16.
WINDOW_V1 = bytes.fromhex(
    "434b504601010010010000000000000000000000000000007017000000000000170000000000000073f8f55f9eab33f4"
    "00000000000000004c1a58c654e32b9728b52ffd00887400003068656c6c6f2001006797be1401"
)
WINDOW_V2 = bytes.fromhex(
    "434b0201100100f02e00001773f8f55f9eab33f480a36d1f28b52ffd00887400003068656c6c6f2001006797be1401"
)
# Last_Block set in the block header (payload byte 6, 0x74 -> 0x75): the zstd frame ends with frame 1,
# and the payload goes on for 3 bytes after its end ("xyz"; payload_size 23 -> 26).
ENDED_V2 = bytes.fromhex(
    "434b0201100100f02e00001a73f8f55f9eab33f4b56aee4a28b52ffd00307500003068656c6c6f2001006797be140178797a"
)
# The same end, and a second zstd frame (an empty one) after it.
SECOND_ZSTD_FRAME_V1 = bytes.fromhex(
    "434b504601010010010000000000000000000000000000007017000000000000200000000000000073f8f55f9eab33f4"
    "0000000000000000d6f83745edaeac4128b52ffd00307500003068656c6c6f2001006797be140128b52ffd0030010000"
)
# Frame 2's raw block with Last_Block set (payload byte 0, 0x10 -> 0x11): the stream ends in a
# continuing frame, the last of its chain.
ENDED_IN_PATCH_V2 = bytes.fromhex("434b0207100201f22ef02e0005cc45d4b32998f4a5f626616e1100000801")


def epilogue_v2() -> bytes:
    """§11's frame 1 with zstd's content checksum on (Frame_Header_Descriptor 0x04): its last block ends
    the zstd frame with the 4-byte epilogue."""
    payload = bytearray(payload_of(V2_FULL))
    payload[4], payload[6] = 0x04, 0x75
    checksum = xxhash.xxh64_intdigest(STATE) & 0xFFFF_FFFF
    return with_fields(V2_FULL, payload=bytes(payload) + struct.pack("<I", checksum), payload_size=len(payload) + 4)


def test_the_damage_vectors_are_the_worked_examples_with_their_zstd_frames_changed() -> None:
    def changed(frame: bytes, at: int, value: int, tail: bytes = b"") -> bytes:
        payload = bytearray(payload_of(frame))
        payload[at] = value
        return with_fields(frame, payload=bytes(payload) + tail, payload_size=len(payload) + len(tail))

    assert changed(V1_FULL, 5, 0x88) == WINDOW_V1
    assert changed(V2_FULL, 5, 0x88) == WINDOW_V2
    assert changed(V2_FULL, 6, 0x75, b"xyz") == ENDED_V2
    assert changed(V1_FULL, 6, 0x75, bytes.fromhex("28b52ffd0030010000")) == SECOND_ZSTD_FRAME_V1
    assert changed(V2_PATCH, 0, 0x11) == ENDED_IN_PATCH_V2
    assert v2_fields(V2_FULL)["window_log"] == 16


def readers(chain: list[bytes]) -> list[Callable[[], object]]:
    return [lambda: decode(chain), lambda: list(iter_versions(chain)), lambda: open_chain(chain)]


BOUNDED_AND_UNENDED = [
    pytest.param([WINDOW_V1, V1_PATCH], "version 1 is corrupt: .*too much memory", id="window-format-1"),
    pytest.param([WINDOW_V2, V2_PATCH], "version 1 is corrupt: .*too much memory", id="window-format-2"),
    pytest.param([WINDOW_V2], "version 1 is corrupt: .*too much memory", id="window-alone"),
    pytest.param([ENDED_V2], r"stream of version 1 ends in its 26-byte payload \(3 bytes after", id="ended"),
    pytest.param([ENDED_V2, V2_PATCH], "stream of version 1 ends", id="ended-then-continued"),
    pytest.param([SECOND_ZSTD_FRAME_V1], r"version 1 ends .*\(9 bytes after", id="second-zstd-frame"),
    pytest.param([epilogue_v2()], "stream of version 1 ends in its 27-byte payload;", id="epilogue"),
    pytest.param([V2_FULL, ENDED_IN_PATCH_V2], "stream of version 2 ends in its 5-byte payload", id="ended-late"),
]


@pytest.mark.parametrize(("chain", "message"), BOUNDED_AND_UNENDED)
def test_every_read_refuses_a_wider_window_or_an_ended_stream(chain: list[bytes], message: str) -> None:
    for read in readers(chain):
        with pytest.raises(DecodeError, match=message):
            read()
    # So does the reader written from FORMAT.md alone, both ways it reads.
    for independent in (lambda: list(read_versions(chain)), lambda: hydrate(chain)):
        with pytest.raises(FormatError, match=r"zstd: .*too much memory|stream ends"):
            independent()


def patch_starting_a_stream(zstd_head: bytes, block_head: bytes) -> bytes:
    """§11's frame 2 as a PATCH starting a stream: a zstd frame header, then 08 01 as a raw block."""
    payload = zstd_head + block_head + b"\x08\x01"
    return with_fields(V2_PATCH, kind_flags=PATCH, payload=payload, payload_size=len(payload))


ZSTD_HEAD = payload_of(V2_FULL)[:6]  # magic, Frame_Header_Descriptor 00, Window_Descriptor 30 (2**16)
RAW_BLOCK = bytes.fromhex("100000")  # 2 bytes, Last_Block 0


@pytest.mark.parametrize(
    "frame",
    [
        pytest.param(patch_starting_a_stream(ZSTD_HEAD[:5] + b"\x88", RAW_BLOCK), id="wider-window"),
        pytest.param(patch_starting_a_stream(ZSTD_HEAD, bytes.fromhex("110000")), id="new-stream-ended"),
        pytest.param(ENDED_IN_PATCH_V2, id="kept-stream-ended"),
    ],
)
def test_a_reader_does_not_advance_past_a_wider_window_or_an_end(frame: bytes) -> None:
    _, reader = open_chain([V2_FULL])
    assert reader is not None and reader.advance([patch_starting_a_stream(ZSTD_HEAD, RAW_BLOCK)]) is not None
    assert reader.latest.state == STATE + b"\x08\x01"
    _, reader = open_chain([V2_FULL])
    assert reader is not None and reader.advance([frame]) is None
    for read in readers([V2_FULL, frame]):
        with pytest.raises(DecodeError, match="version 2"):
            read()


# -- decode names a damaged payload as iter_versions does ------------------------


# Every stream shape in one chain: patches and a delta continuing a stream, a patch starting one on the
# base's tail (a resumed encoder), a delta starting one on the whole base (a rollback).
LONG_CHAIN = Case(
    "every-stream-shape",
    [
        ("merge", _cp(1, "plan the fix")),
        ("merge", _patch(2, "ls\nREADME.md")),
        ("merge", _patch(3, "cat README.md")),
        ("replace", _cp(4, "plan the fix", "open a.py")),
        ("merge", _patch(5, "a.py: 40 lines")),
        ("resume", b""),
        ("merge", _patch(6, "edit a.py")),
        ("merge", _patch(7, "run pytest")),
        ("replace", _cp(8, "lost")),
        ("rollback", b""),
        ("replace", _cp(8, "plan the fix", "open a.py", "1 failed")),
        ("merge", _patch(9, "fixed")),
    ],
)


def test_the_long_chain_has_every_stream_shape() -> None:
    headers = [parse(frame)[0] for frame, _ in run(LONG_CHAIN)]
    assert [(h.kind.name, h.continues_stream, h.prefix_size > 0) for h in headers] == [
        ("FULL", False, False),
        *[("PATCH", True, False)] * 2,
        ("DELTA", True, False),
        ("PATCH", True, False),
        ("PATCH", False, True),
        ("PATCH", True, False),
        ("DELTA", False, True),
        ("PATCH", True, False),
    ]


@pytest.mark.parametrize("fmt", READABLE_FORMATS)
def test_decode_names_a_damaged_payload_as_reading_every_version_does(fmt: int) -> None:
    named = 0
    golden = [frames for frames, _ in CHAINS if is_v2(frames[0]) == (fmt == 2)]
    for chain in [[frame for frame, _ in run(LONG_CHAIN, format_version=fmt)], *golden]:
        latest = decode(chain)
        for i, frame in enumerate(chain):
            start = len(frame) - len(payload_of(frame))
            for at in range(start, len(frame)):
                for bit in (0x01, 0x10, 0x80):
                    bad = bytearray(frame)
                    bad[at] ^= bit
                    damaged = [*chain[:i], with_checksum(bytes(bad)), *chain[i + 1 :]]
                    try:
                        got = decode(damaged)
                    except CodecError as error:
                        for read in readers(damaged)[1:]:
                            with pytest.raises(CodecError) as other:
                                read()
                            assert (type(other.value), str(other.value)) == (type(error), str(error))
                        named += 1
                    else:
                        assert got == latest  # an equivalent zstd encoding: never other bytes
    assert named > 1000
