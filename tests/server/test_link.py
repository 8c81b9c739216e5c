"""The frames between the sidecar's gRPC process and its store process (sidecar/link.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckpt.sidecar.server.link import HEADER_BYTES, Frame, FrameReader, FrameWriter, Kind, LinkError, encode

# kind 2 (REPLY), method 0, status 10 (ABORTED), tag 7, 64 bytes of meta, no body.
_GOLDEN_META = b'{"details":"conflict","trailers":[["ckpt-current-version","4"]]}'
_GOLDEN = (
    bytes([2, 0, 10, 0])
    + (7).to_bytes(4, "little")
    + len(_GOLDEN_META).to_bytes(4, "little")
    + (0).to_bytes(4, "little")
    + _GOLDEN_META
)


def test_golden_frame_both_ways() -> None:
    frame = Frame(
        Kind.REPLY, tag=7, status=10, meta={"details": "conflict", "trailers": [["ckpt-current-version", "4"]]}
    )
    assert encode(frame) == _GOLDEN
    assert FrameReader(max_frame_bytes=1 << 20).feed(_GOLDEN) == [frame]


frames = st.builds(
    Frame,
    kind=st.sampled_from(Kind),
    tag=st.integers(0, 2**32 - 1),
    method=st.integers(0, 255),
    status=st.integers(0, 255),
    meta=st.dictionaries(st.text(max_size=8), st.text(max_size=20) | st.integers(), max_size=3),
    body=st.binary(max_size=300),
)


def _feed_in_pieces(reader: FrameReader, sent: list[Frame], cuts: list[int]) -> list[Frame]:
    """What ``reader`` makes of ``sent``'s bytes fed in pieces of the sizes ``cuts`` gives, in turn."""
    data = b"".join(map(encode, sent))
    got: list[Frame] = []
    offset, i = 0, 0
    while offset < len(data):
        size = cuts[i % len(cuts)]
        got += reader.feed(data[offset : offset + size])
        offset += size
        i += 1
    return got


@given(st.lists(frames, max_size=8), st.lists(st.integers(1, 64), min_size=1))
def test_frames_come_back_whatever_pieces_the_bytes_arrive_in(sent: list[Frame], cuts: list[int]) -> None:
    assert _feed_in_pieces(FrameReader(max_frame_bytes=1 << 20), sent, cuts) == sent


@given(st.lists(frames, max_size=8), st.lists(st.integers(1, 64), min_size=1), st.integers(0, 40))
def test_large_bodies_kept_as_pieces_come_back_whatever_pieces_the_bytes_arrive_in(
    sent: list[Frame], cuts: list[int], large_body_bytes: int
) -> None:
    """With a small ``large_body_bytes``, most bodies take the path a hot Get's state takes."""
    reader = FrameReader(max_frame_bytes=1 << 20, large_body_bytes=large_body_bytes)
    got = _feed_in_pieces(reader, sent, cuts)
    assert got == sent and all(type(frame.body) is bytes for frame in got)


def test_a_large_body_arriving_in_pieces_is_joined_once_complete() -> None:
    body = bytes(range(256)) * 1200  # 307,200 bytes
    small = Frame(Kind.REPLY, tag=1, body=b"ok")
    data = encode(Frame(Kind.REPLY, tag=2, meta={"details": "x"}, body=body)) + encode(small)
    reader = FrameReader(max_frame_bytes=1 << 20)
    pieces = [data[i : i + 65536] for i in range(0, len(data), 65536)]
    assert [reader.feed(piece) for piece in pieces[:-1]] == [[]] * (len(pieces) - 1)
    assert reader.feed(pieces[-1]) == [Frame(Kind.REPLY, tag=2, meta={"details": "x"}, body=body), small]


def test_a_partial_frame_waits_for_the_rest() -> None:
    reader = FrameReader(max_frame_bytes=1 << 20)
    assert reader.feed(_GOLDEN[:-1]) == []
    assert len(reader.feed(_GOLDEN[-1:])) == 1


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (encode(Frame(Kind.CALL, body=b"x" * 101)), "declares 101 bytes; the limit is 100"),
        (bytes([99]) + _GOLDEN[1:], "unknown kind 99"),
        (_GOLDEN[:12] + (0).to_bytes(4, "little") + b"", None),  # a header whose 64 bytes of meta have not come: waits
        (bytes([2, 0, 0, 0]) + (1).to_bytes(4, "little") + (3).to_bytes(4, "little") + bytes(4) + b"{x}", "not JSON"),
    ],
)
def test_bytes_that_are_not_frames_are_named(data: bytes, message: str | None) -> None:
    reader = FrameReader(max_frame_bytes=100)
    if message is None:
        assert reader.feed(data) == []
        return
    with pytest.raises(LinkError, match=message):
        reader.feed(data)


def test_the_header_is_16_bytes() -> None:
    assert HEADER_BYTES == 16
    assert len(encode(Frame(Kind.CLOSE))) == 16


class _Turns:
    """A FrameWriter's transport and event loop, recorded: what was written, and what waits for the turn's end."""

    def __init__(self) -> None:
        self.writes: list[list[bytes]] = []
        self.scheduled: list[Callable[[], None]] = []
        self.writer = FrameWriter(self.writes.append, self.scheduled.append)

    def end_turn(self) -> None:
        while self.scheduled:
            self.scheduled.pop(0)()

    def frames(self) -> list[Frame]:
        return FrameReader(max_frame_bytes=1 << 20).feed(b"".join(b"".join(w) for w in self.writes))


def test_frames_sent_in_one_turn_are_written_together_at_its_end() -> None:
    turns = _Turns()
    replies = [Frame(Kind.REPLY, tag=i, body=b"r%d" % i) for i in range(16)]
    for frame in replies:
        turns.writer.send(frame)
    assert turns.writes == [] and len(turns.scheduled) == 1  # one flush for the turn
    turns.end_turn()
    assert len(turns.writes) == 1 and turns.frames() == replies
    turns.writer.send(Frame(Kind.CLOSE))
    turns.end_turn()
    assert len(turns.writes) == 2 and turns.frames() == [*replies, Frame(Kind.CLOSE)]


def test_a_large_body_is_written_at_once_behind_what_is_queued() -> None:
    turns = _Turns()
    small, large = Frame(Kind.REPLY, tag=1, body=b"x"), Frame(Kind.REPLY, tag=2, body=b"y" * (1 << 20))
    turns.writer.send(small)
    turns.writer.send(large)
    assert turns.frames() == [small, large]  # before the turn ends
    assert any(part is large.body for part in turns.writes[0])  # not copied to join its header
    turns.end_turn()  # the flush scheduled for `small` finds nothing left
    assert len(turns.writes) == 1


def test_flush_writes_what_is_queued_now() -> None:
    turns = _Turns()
    turns.writer.send(Frame(Kind.READY))
    turns.writer.flush()  # before the transport closes
    assert turns.frames() == [Frame(Kind.READY)]
    turns.end_turn()
    assert len(turns.writes) == 1
