"""Golden frame vectors, checked both ways: the encoder must produce exactly the
committed bytes, and the committed bytes must decode to the committed states."""

from __future__ import annotations

import json

import pytest

from ckpt.codec import FrameKind, decode, iter_versions, parse
from tests.golden.cases import CASES, GOLDEN, run

VECTORS = json.loads(GOLDEN.read_text())


def test_every_case_has_vectors() -> None:
    assert sorted(VECTORS) == sorted(c.name for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_encoder_produces_the_golden_bytes(case) -> None:
    got = [(f.hex(), s.hex()) for f, s in run(case)]
    want = [(v["frame"], v["state"]) for v in VECTORS[case.name]]
    assert got == want, "frame bytes changed: a format change needs a FORMAT_VERSION bump (see tests/golden/cases.py)"


@pytest.mark.parametrize("name", sorted(VECTORS))
def test_golden_bytes_decode_to_the_golden_states(name: str) -> None:
    frames = [bytes.fromhex(v["frame"]) for v in VECTORS[name]]
    states = [bytes.fromhex(v["state"]) for v in VECTORS[name]]
    start = 0
    for i, frame in enumerate(frames):
        if parse(frame)[0].kind is FrameKind.FULL:
            start = i
        assert decode(frames[start : i + 1]) == states[i]
    assert [d.state for d in iter_versions(frames[start:])] == states[start:]


def test_vectors_cover_every_frame_shape() -> None:
    shapes = set()
    for vectors in VECTORS.values():
        for v in vectors:
            header, _ = parse(bytes.fromhex(v["frame"]))
            shapes.add((header.kind, header.continues_stream, header.prefix_size > 0))
    assert shapes >= {
        (FrameKind.FULL, False, False),
        (FrameKind.DELTA, True, False),  # continues the chain's stream
        (FrameKind.DELTA, False, True),  # starts a stream on the whole base
        (FrameKind.PATCH, True, False),
        (FrameKind.PATCH, False, True),  # starts a stream on the base's tail
    }
