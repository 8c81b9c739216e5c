"""sealed_prefix: the first bytes of a sealed FULL frame's state, decoded without the rest of its blocks, for a
PREFIX version read from a folded head (FORMAT.md §12, §13); any doubt is the whole decode, with its errors."""

from __future__ import annotations

import random

import pytest

from ckpt.codec import (
    ChainEncoder,
    ChecksumError,
    DecodeError,
    StateTooLargeError,
    _zstd,
    decode_latest,
    keyframe,
    prefix_frame,
    prefix_state,
    sealed_prefix,
)
from tests.codec.test_sealed_frames import HOSTILE, SEALED, STATE


def state_of(size: int, seed: int) -> bytes:
    rng = random.Random(seed)
    words = [bytes(rng.choice(b"abcdefghij") for _ in range(rng.randint(2, 9))) for _ in range(300)]
    out = bytearray()
    while len(out) < size:
        out += rng.choice(words) + (rng.randbytes(3) if rng.random() < 0.2 else b" ")
    return bytes(out[:size])


def refuse_whole_decodes(monkeypatch: pytest.MonkeyPatch) -> None:
    def whole(*_: object, **__: object) -> object:
        raise AssertionError("decoded the whole sealed frame")

    monkeypatch.setattr(_zstd, "decompress_sealed", whole)
    monkeypatch.setattr(_zstd, "new_reader", whole)


@pytest.mark.parametrize("size", [1, 6002, 131_073, 300_000, 3 * 1024 * 1024])  # 3 MiB: past the reused window
def test_a_prefix_of_a_sealed_frame_equals_the_whole_decodes_prefix(size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    state = state_of(size, size)
    frame = keyframe(state, version=9).data
    whole = decode_latest([frame])
    refuse_whole_decodes(monkeypatch)
    for n in sorted({0, 1, size // 3, size // 2, size - 1} - {size}):
        header, got = sealed_prefix(frame, n)
        assert (header, got) == (whole.header, whole.state[:n]), n
        version = prefix_frame(whole.state, version=3, source_version=9, state_size=n)
        assert prefix_state(version.data, got, source_version=9, source_size=header.state_size).state == state[:n]


def test_a_prefix_as_large_as_the_state_is_the_whole_decode() -> None:
    header, got = sealed_prefix(SEALED, len(STATE) + 5)
    assert (header.version, got) == (2, STATE)


def test_a_frame_that_is_not_sealed_is_decoded_whole() -> None:
    enc = ChainEncoder(format_version=1)
    frame = enc.replace(STATE).data
    header, got = sealed_prefix(frame, 10)
    assert (header.sealed, got) == (False, STATE[:10])


def damaged(frame: bytes, at: int) -> bytes:
    out = bytearray(frame)
    out[at] ^= 0x10
    return bytes(out)


@pytest.mark.parametrize(
    "frame",
    [pytest.param(frame, id=param.id) for param in HOSTILE for frame, _ in [param.values]]
    + [pytest.param(damaged(SEALED, at), id=f"flip-{at}") for at in (3, 8, 30, len(SEALED) - 5, len(SEALED) - 1)],
)
def test_a_damaged_sealed_frame_is_refused_as_its_whole_decode_refuses_it(frame: bytes) -> None:
    with pytest.raises(DecodeError) as whole:
        decode_latest([frame])
    with pytest.raises(DecodeError) as prefix:
        sealed_prefix(frame, 10)
    assert (type(prefix.value), str(prefix.value)) == (type(whole.value), str(whole.value))


def test_a_state_over_max_state_bytes_is_refused_before_anything_is_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_whole_decodes(monkeypatch)
    monkeypatch.setattr(_zstd, "decompress_sealed_prefix", lambda *_, **__: pytest.fail("decoded past the bound"))
    with pytest.raises(StateTooLargeError, match="version 2 declares a 6002-byte state; max_state_bytes is 6001"):
        sealed_prefix(SEALED, 10, max_state_bytes=6001)


def test_the_prefix_is_checked_by_the_prefix_frames_xxh3() -> None:
    header, got = sealed_prefix(SEALED, 100)
    version = prefix_frame(STATE, version=1, source_version=2, state_size=100)
    with pytest.raises(ChecksumError, match="state of version 1"):
        prefix_state(version.data, b"x" + got[1:], source_version=2, source_size=header.state_size)
    with pytest.raises(ValueError, match="source_state holds 99 bytes of version 2's state"):
        prefix_state(version.data, got[:99], source_version=2, source_size=header.state_size)


@pytest.mark.parametrize(("size", "error"), [(-1, ValueError), (True, TypeError), (1.0, TypeError)])
def test_sealed_prefix_refuses_a_bad_size(size: object, error: type) -> None:
    with pytest.raises(error, match="size must be"):
        sealed_prefix(SEALED, size)  # type: ignore[arg-type]
