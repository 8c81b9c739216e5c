"""Sealed FULL frames (FORMAT.md §13): a keyframe's payload is one whole zstd frame declaring its content
size, decoded in one shot; every reader refuses a sealed frame that breaks §13's rules, naming the version,
and no frame continues a sealed frame's stream."""

from __future__ import annotations

import random
import re
import sys
from pathlib import Path

import pytest

from ckpt.codec import (
    ChainEncoder,
    ChainLinkError,
    ChainPolicy,
    DecodeError,
    OutputTooLargeError,
    StateTooLargeError,
    UnsupportedFormatError,
    _zstd,
    decode,
    decode_latest,
    decode_sealed,
    iter_versions,
    keyframe,
    open_chain,
    pack,
    parse,
)
from ckpt.codec.decoder import latest_with_reader
from tests.codec.layout import payload_of, with_fields

if sys.version_info >= (3, 14):
    from compression.zstd import CompressionParameter, ZstdCompressor
else:
    from backports.zstd import CompressionParameter, ZstdCompressor

FORMAT_MD = Path(__file__).parents[2] / "codec" / "FORMAT.md"
SEALED = bytes.fromhex(re.findall(r"```\n([0-9a-f]+)\n```", FORMAT_MD.read_text())[5])  # §13, version 2
STATE = b"hello " * 1000 + b"\x08\x01"
PAYLOAD = payload_of(SEALED)


def readers(chain: list[bytes]) -> list[object]:
    return [lambda: decode(chain), lambda: list(iter_versions(chain)), lambda: open_chain(chain)]


def with_payload(payload: bytes, frame: bytes = SEALED) -> bytes:
    return with_fields(frame, payload=payload, payload_size=len(payload))


def unended_zstd(data: bytes) -> bytes:
    """``data`` in a zstd frame without a content size: a stream's, ended (FLUSH_FRAME after CONTINUE)."""
    compressor = ZstdCompressor(options={CompressionParameter.window_log: 16})
    return compressor.compress(data) + compressor.flush()


def test_the_sealed_example_decodes_on_every_path() -> None:
    header, _ = parse(SEALED)
    assert header.sealed and header.version == 2 and SEALED[3] == 0x09
    assert decode([SEALED]) == STATE
    assert decode_latest([SEALED]).header == header
    assert [(v.version, v.state) for v in iter_versions([SEALED])] == [(2, STATE)]
    latest, reader = open_chain([SEALED])
    assert latest.state == STATE and reader is not None and not reader.spent


def test_keyframes_are_sealed_in_format_2_only() -> None:
    assert keyframe(STATE, version=2).data == SEALED
    old = keyframe(STATE, version=2, format_version=1)
    assert not old.header.sealed and decode([old.data]) == STATE
    with pytest.raises(ValueError, match="SEALED flag: format 1 has none"):
        pack(parse(SEALED)[0], bytes(PAYLOAD), format_version=1)


@pytest.mark.parametrize("size", [0, 1, 6002, 300_000, 3 * 1024 * 1024])
def test_a_sealed_keyframe_stores_no_more_than_a_few_bytes_over_a_streams_full_frame(size: int) -> None:
    rng = random.Random(size)
    words = [rng.randbytes(4).hex() for _ in range(2000)]
    state = " ".join(rng.choices(words, k=size // 9 + 1)).encode()[:size]
    sealed, unsealed = keyframe(state, version=1), ChainEncoder().replace(state)
    assert sealed.header.sealed and not unsealed.header.sealed
    assert sealed.header.window_log == unsealed.header.window_log
    assert len(sealed.data) <= len(unsealed.data) + (9 if size == 0 else 4)  # the content size; 9: an empty zstd frame
    assert decode([sealed.data]) == state == next(iter(iter_versions([sealed.data]))).state


def test_a_sealed_frame_decodes_in_one_shot_without_a_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_stream(**_: object) -> object:
        raise AssertionError("a sealed frame's one-pass decode made a streaming decompressor")

    monkeypatch.setattr(_zstd, "new_reader", no_stream)
    monkeypatch.setattr(_zstd, "decompress_once", no_stream)
    assert decode([SEALED]) == STATE
    assert open_chain([SEALED])[0].state == STATE
    assert [v.state for v in iter_versions([SEALED])] == [STATE]


def test_the_budgets_hold_before_a_sealed_frame_is_decompressed(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object, **__: object) -> object:
        raise AssertionError("decompressed past a budget")

    monkeypatch.setattr(_zstd, "decompress_sealed", refuse)
    monkeypatch.setattr(_zstd, "new_reader", refuse)
    with pytest.raises(StateTooLargeError, match="version 2 declares a 6002-byte state"):
        decode([SEALED], max_state_bytes=6001)
    with pytest.raises(OutputTooLargeError, match="version 2 would output 6002 bytes"):
        open_chain([SEALED], max_output_bytes=6001)


EMPTY_ZSTD_FRAME = bytes.fromhex("28b52ffd2000010000")  # a whole zstd frame of no content
SKIPPABLE = bytes.fromhex("505a2a1802000000abcd")
HOSTILE = [
    pytest.param(with_payload(PAYLOAD + b"xyz"), r"ends 3 bytes before the end of its 29-byte", id="trailing-bytes"),
    pytest.param(with_payload(PAYLOAD + EMPTY_ZSTD_FRAME), "ends 9 bytes before the end", id="two-zstd-frames"),
    pytest.param(with_payload(unended_zstd(STATE)), "declares no content size", id="no-content-size"),
    pytest.param(with_payload(keyframe(STATE + b"!", version=2).data[24:]), "size of 6003 bytes", id="other-size"),
    pytest.param(with_payload(PAYLOAD[:7] + b"\x84" + PAYLOAD[8:]), "does not end in its 26-byte", id="unended"),
    pytest.param(with_payload(PAYLOAD[:-1]), "does not end in its 25-byte payload", id="cut-short"),
    pytest.param(with_payload(SKIPPABLE + PAYLOAD), "does not start a zstd frame", id="skippable-first"),
    pytest.param(with_fields(SEALED, window_log=12), "6002-byte window, over 2..12", id="window-over-window-log"),
    pytest.param(with_fields(SEALED, kind_flags=0x01), "ends in its 26-byte payload", id="ended-but-not-sealed"),
]


@pytest.mark.parametrize(("frame", "message"), HOSTILE)
def test_every_read_refuses_a_sealed_frame_that_breaks_its_rules(
    frame: bytes, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for read in readers([frame]):
        with pytest.raises(DecodeError, match=f"version 2.*{message}|{message}.*version 2") as caught:
            read()  # type: ignore[operator]
        assert "version 2" in str(caught.value)
    if frame[3] == 0x09:  # the one-shot path refuses it too, before its reused context decodes anything

        def decoded(*_: object, **__: object) -> object:
            raise AssertionError("decoded a sealed frame that breaks its rules in one shot")

        monkeypatch.setattr(_zstd, "decompress_sealed", decoded)
        with pytest.raises(DecodeError, match=message):
            latest_with_reader([frame], None)


@pytest.mark.parametrize(("frame", "message"), HOSTILE)
def test_decode_sealed_leaves_a_frame_that_breaks_the_rules_to_the_chain_decode(
    frame: bytes, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def decoded(*_: object, **__: object) -> object:
        raise AssertionError("decoded a sealed frame that breaks its rules in one shot")

    monkeypatch.setattr(_zstd, "decompress_sealed", decoded)
    assert decode_sealed(frame) is None  # decode_latest names the error


def test_decode_sealed_answers_as_decode_latest_or_not_at_all() -> None:
    """Every cut and every bit flip of the sealed example: None, or what decode_latest answers; the
    untouched frame: decode_latest's answer, and None for a frame of another kind or over a bound."""
    whole = decode_sealed(SEALED)
    assert whole == decode_latest([SEALED]) and whole is not None and whole.state == STATE
    assert decode_sealed(SEALED, max_state_bytes=len(STATE) - 1) is None
    assert decode_sealed(after_keyframe(patch_window_bytes=0)[0]) is None
    variants = [SEALED[:n] for n in range(len(SEALED))]
    variants += [
        SEALED[:i] + bytes([SEALED[i] ^ 1 << b]) + SEALED[i + 1 :] for i in range(len(SEALED)) for b in range(8)
    ]
    for frame in variants:
        got = decode_sealed(frame)
        if got is not None:
            assert got == decode_latest([frame]), frame.hex()


def after_keyframe(*, patch_window_bytes: int) -> list[bytes]:
    """Frames an encoder resumed on the sealed example writes: the first starts a stream."""
    policy = ChainPolicy(patch_window_bytes=patch_window_bytes)
    enc = ChainEncoder.resume(STATE, [parse(SEALED)[0]], policy=policy)
    return [enc.merge(b"\x10\x03").data, enc.merge(b"\x10\x04").data, enc.merge(b"\x18\x05").data]


@pytest.mark.parametrize("kind_flags", [0x0A, 0x0B, 0x0E, 0x0F])
def test_the_flag_on_a_delta_or_patch_frame_is_refused(kind_flags: int) -> None:
    frames = after_keyframe(patch_window_bytes=0)
    bad = with_fields(frames[0], kind_flags=kind_flags)
    for read in readers([SEALED, bad]):
        with pytest.raises(UnsupportedFormatError, match=r"version 3.*SEALED flag on a (DELTA|PATCH) frame"):
            read()  # type: ignore[operator]


def test_a_frame_continuing_a_sealed_stream_is_a_link_error() -> None:
    continuing = with_fields(after_keyframe(patch_window_bytes=0)[0], kind_flags=0x07)
    for read in readers([SEALED, continuing]):
        with pytest.raises(ChainLinkError, match="version 3 continues a stream, but version 2 is a sealed FULL"):
            read()  # type: ignore[operator]
    _, reader = open_chain([SEALED])
    assert reader is not None and reader.advance([continuing]) is None and reader.spent


@pytest.mark.parametrize("patch_window_bytes", [0, 64 * 1024])
def test_frames_starting_a_stream_after_a_keyframe_decode_and_advance(patch_window_bytes: int) -> None:
    frames = after_keyframe(patch_window_bytes=patch_window_bytes)
    assert not any(parse(f)[0].continues_stream for f in frames[:1])
    states = [v.state for v in iter_versions([SEALED, *frames])]
    assert decode([SEALED, *frames]) == states[-1] == STATE + b"\x10\x03\x10\x04\x18\x05"
    _, reader = open_chain([SEALED])
    assert reader is not None
    assert reader.advance(frames[:1]) is not None and reader.latest.state == states[1]
    assert reader.advance(frames[1:]) is not None and reader.latest.state == states[-1]
    _, reader = open_chain([SEALED, *frames[:2]])  # a live stream after the keyframe
    assert reader is not None and reader.advance(frames[2:]) is not None and reader.latest.state == states[-1]
