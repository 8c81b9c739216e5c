"""pack(): a header re-packed in either format reads back, and a header no reader would take is refused by
the name of its field and the limit, never written (nor a bare struct error)."""

from __future__ import annotations

from typing import Any

import pytest

from ckpt.codec import ChainEncoder, FrameKind, decode, iter_versions, pack, parse, state_checksum
from tests.golden.cases import GOLDEN_POLICY, SYSTEM

STATE = SYSTEM.encode() * 3


def chain(fmt: int) -> list[bytes]:
    """A FULL frame, a PATCH continuing its stream and a REPLACE's DELTA."""
    enc = ChainEncoder(policy=GOLDEN_POLICY, format_version=fmt)
    frames = [enc.replace(STATE), enc.merge(b"\x08\x01"), enc.replace(STATE + b"\x08\x02")]
    assert [f.kind for f in frames] == [FrameKind.FULL, FrameKind.PATCH, FrameKind.DELTA]
    return [f.data for f in frames]


@pytest.mark.parametrize(("src", "dst"), [(2, 1), (1, 2), (1, 1), (2, 2)])
def test_a_chain_repacked_in_either_format_decodes_to_the_same_states(src: int, dst: int) -> None:
    frames = chain(src)
    states = [d.state for d in iter_versions(frames)]
    repacked = []
    for i, frame in enumerate(frames):
        header, payload = parse(frame)
        if i and dst == 1 and src == 2:
            # Format 1 records the base's xxh3, which a format 2 header does not hold: refused until it is set.
            with pytest.raises(ValueError, match=f"base_xxh3 is not set: a format 1 {header.kind.name} frame"):
                pack(header, bytes(payload), format_version=dst)
            header = header._replace(base_xxh3=state_checksum(states[i - 1]))
        repacked.append(pack(header, bytes(payload), format_version=dst))
    assert [parse(f)[0].format for f in repacked] == [dst] * 3
    assert [d.state for d in iter_versions(repacked)] == states
    assert decode(repacked) == states[-1]


# (format, field changes to the FULL frame's header, error, message); None: packs and reads back.
FULL_CASES: list[tuple[int, dict[str, Any], type[Exception] | None, str]] = [
    (2, {"base_version": 3}, ValueError, "base_version 3: a FULL frame has no base"),
    (1, {"base_version": 3}, ValueError, "base_version 3: a FULL frame has no base"),
    (2, {"base_size": 1}, ValueError, "base_size 1: a FULL frame has no base"),
    (2, {"continues_stream": True}, ValueError, "continues_stream True: a FULL frame has no base"),
    (1, {"version": 2**64 - 1}, None, ""),
    (2, {"version": 2**64 - 1}, None, ""),
    (1, {"version": 2**64}, ValueError, f"version must be in 0..{2**64 - 1} in format 1, got {2**64}"),
    (2, {"version": 2**64}, ValueError, "version must be in 0..18446744073709551615 in format 2, got"),
    (1, {"version": 0}, ValueError, r"version 0 \(versions start at 1\)"),
    (1, {"state_size": 2**32}, ValueError, "state_size must be in 0..4294967295 in format 1, got 4294967296"),
    (1, {"state_size": -1}, ValueError, "state_size must be in 0..4294967295 in format 1, got -1"),
    (2, {"state_size": 2**64}, ValueError, "state_size must be in 0..18446744073709551615 in format 2"),
    (2, {"state_xxh3": 2**64}, ValueError, "state_xxh3 must be in 0..18446744073709551615 in format 2"),
    (2, {"window_log": 31}, None, ""),
    (2, {"window_log": 10}, None, ""),
    (2, {"window_log": 32}, ValueError, "window_log 32 outside 10..31"),
    (1, {"window_log": 300}, ValueError, "window_log 300 outside 10..31"),
    (2, {"window_log": 9}, ValueError, "window_log 9 outside 10..31"),
    (2, {"window_log": 16.0}, TypeError, "window_log must be an int, got float"),
    (2, {"version": True}, TypeError, "version must be an int, got bool"),
    (2, {"kind": 1}, TypeError, "kind must be a FrameKind, got int"),
]


@pytest.mark.parametrize(("fmt", "changes", "error", "message"), FULL_CASES, ids=str)
def test_a_header_is_packed_only_within_its_formats_limits(
    fmt: int, changes: dict[str, Any], error: type[Exception] | None, message: str
) -> None:
    header, payload = parse(chain(fmt)[0])
    changed = header._replace(**changes)
    if error is None:
        assert parse(pack(changed, bytes(payload)))[0] == changed
        return
    with pytest.raises(error, match=message):
        pack(changed, bytes(payload))


@pytest.mark.parametrize(("value", "error"), [(1.0, TypeError), (True, TypeError), (3, ValueError), (0, ValueError)])
def test_pack_takes_only_a_known_format_version(value: object, error: type[Exception]) -> None:
    header, payload = parse(chain(2)[0])
    with pytest.raises(error, match="format_version must be"):
        pack(header, bytes(payload), format_version=value)  # type: ignore[arg-type]
