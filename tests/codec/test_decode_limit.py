"""decode()/iter_versions() with max_state_bytes.

Frames from an untrusted source cannot make the reader allocate past the caller's limit.
"""

from __future__ import annotations

from typing import Any

import pytest

import ckpt.codec._zstd
from ckpt.codec import ChainEncoder, DecodeError, StateTooLargeError, decode, iter_versions, open_chain


def _chain(*states: bytes) -> list[bytes]:
    """One chain (a FULL frame, then deltas) through ``states``."""
    enc = ChainEncoder()
    frames = [enc.replace(s) for s in states]
    assert [f.kind.name for f in frames[1:]] == ["DELTA"] * (len(states) - 1)  # not a second chain
    return [f.data for f in frames]


@pytest.mark.parametrize(
    ("limit", "refused"),
    [(None, None), (10_000, None), (9_999, (2, 10_000)), (99, (1, 100)), (0, (1, 100))],
)
def test_every_state_of_the_chain_is_checked_against_the_limit(
    limit: int | None, refused: tuple[int, int] | None
) -> None:
    state = b"checkpoint " * 909 + b"x"  # 10,000 bytes
    assert len(state) == 10_000
    frames = _chain(state[:100], state)
    if refused is None:
        assert decode(frames, max_state_bytes=limit) == state
        return
    version, size = refused
    with pytest.raises(StateTooLargeError) as info:
        decode(frames, max_state_bytes=limit)
    assert str(info.value) == f"frame of version {version} declares a {size}-byte state; max_state_bytes is {limit}"
    assert (info.value.version, info.value.state_size, info.value.limit) == (version, size, limit)
    assert isinstance(info.value, DecodeError)


def test_an_oversize_earlier_version_is_refused_before_anything_is_decompressed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    frames = _chain(b"big " * 100, b"big " * 5_000, b"big " * 4_000)
    calls: list[Any] = []
    for name in ("new_reader", "decompress_once"):  # a new stdlib decompressor, the thread's reused context
        real = getattr(ckpt.codec._zstd, name)

        def counting(*args: Any, real: Any = real, **kwargs: Any) -> Any:
            calls.append(kwargs)
            return real(*args, **kwargs)

        monkeypatch.setattr(ckpt.codec._zstd, name, counting)
    with pytest.raises(StateTooLargeError, match="version 2 declares a 20000-byte state"):
        decode(frames, max_state_bytes=1_000)
    assert calls == []
    assert decode(frames, max_state_bytes=20_000) == b"big " * 4_000
    assert calls  # the same counter sees a decode that is allowed


def test_iter_versions_yields_up_to_the_first_oversize_version() -> None:
    frames = _chain(b"step " * 200, b"step " * 300, b"step " * 500)
    seen: list[int] = []
    with pytest.raises(StateTooLargeError, match="version 3 declares a 2500-byte state; max_state_bytes is 2000"):
        for decoded in iter_versions(frames, max_state_bytes=2_000):
            seen.append(decoded.version)
    assert seen == [1, 2]
    assert [d.state for d in iter_versions(frames, max_state_bytes=2_500)][-1] == b"step " * 500


@pytest.mark.parametrize(
    ("limit", "error", "message"),
    [
        (-1, ValueError, "max_state_bytes must be >= 0, got -1"),
        ("10", TypeError, "max_state_bytes must be an int or None, not str"),
        (True, TypeError, "max_state_bytes must be an int or None, not bool"),
        (1.5, TypeError, "max_state_bytes must be an int or None, not float"),
    ],
)
def test_a_bad_limit_is_misuse(limit: Any, error: type[Exception], message: str) -> None:
    frames = _chain(b"state")
    with pytest.raises(error, match=message):
        decode(frames, max_state_bytes=limit)
    with pytest.raises(error, match=message):
        list(iter_versions(frames, max_state_bytes=limit))


def _sized_chain(fmt: int) -> list[bytes]:
    """Versions 1-4 of 100, 200, 300 and 400 bytes: a limit of 99, 199, 299 or 399 refuses from that version on."""
    enc = ChainEncoder(format_version=fmt)
    frames = [enc.replace(b"v" * 100 * n) for n in range(1, 5)]
    assert [f.kind.name for f in frames] == ["FULL", "DELTA", "DELTA", "DELTA"]
    return [f.data for f in frames]


def _named(run: Any) -> tuple[str, str]:
    with pytest.raises(DecodeError) as info:
        run()
    return type(info.value).__name__, str(info.value)


# (limit, damaged version, the error and the version it names): the first failure in chain order, where a frame
# over the limit counts once its own checksum has passed (the damaged frame's size is no claim to count).
LIMIT_AND_DAMAGE = [
    (99, 4, "StateTooLargeError", 1),
    (199, 4, "StateTooLargeError", 2),
    (299, 4, "StateTooLargeError", 3),
    (399, 4, "ChecksumError", 4),
    (None, 4, "ChecksumError", 4),
    (99, 1, "ChecksumError", 1),
    (199, 2, "ChecksumError", 2),
    (199, 3, "StateTooLargeError", 2),
    (299, 2, "ChecksumError", 2),
]


@pytest.mark.parametrize("fmt", [1, 2])
@pytest.mark.parametrize(("limit", "damaged", "error", "named"), LIMIT_AND_DAMAGE)
def test_decode_names_the_first_of_an_oversize_version_and_damage_as_iter_versions_does(
    fmt: int, limit: int | None, damaged: int, error: str, named: int
) -> None:
    frames = _sized_chain(fmt)
    flipped = bytearray(frames[damaged - 1])
    flipped[-1] ^= 1  # a payload bit: the frame fails its checksum
    frames[damaged - 1] = bytes(flipped)
    every = _named(lambda: list(iter_versions(frames, max_state_bytes=limit)))
    assert every[0] == error and f"version {named} " in every[1], every
    assert _named(lambda: decode(frames, max_state_bytes=limit)) == every
    assert _named(lambda: open_chain(frames, max_state_bytes=limit)) == every
