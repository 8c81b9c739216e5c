"""Golden frame vectors of every format, checked both ways: the encoder must produce exactly the
committed bytes, and the committed bytes must decode to the committed states."""

from __future__ import annotations

import json

import pytest

from ckpt.codec import READABLE_FORMATS, FrameKind, decode, iter_versions, parse
from tests.golden.cases import CASES, GOLDEN_FILES, run

VECTORS = {fmt: json.loads(path.read_text()) for fmt, path in GOLDEN_FILES.items()}
FORMAT_CASES = [(fmt, case) for fmt in READABLE_FORMATS for case in CASES]


@pytest.mark.parametrize("fmt", READABLE_FORMATS)
def test_every_case_has_vectors(fmt: int) -> None:
    assert sorted(VECTORS[fmt]) == sorted(c.name for c in CASES)


@pytest.mark.parametrize(("fmt", "case"), FORMAT_CASES, ids=lambda x: str(getattr(x, "name", x)))
def test_encoder_produces_the_golden_bytes(fmt: int, case) -> None:
    got = [(f.hex(), s.hex()) for f, s in run(case, format_version=fmt)]
    want = [(v["frame"], v["state"]) for v in VECTORS[fmt][case.name]]
    assert got == want, "frame bytes changed: a format change needs a FORMAT_VERSION bump (see tests/golden/cases.py)"


@pytest.mark.parametrize(("fmt", "name"), [(fmt, name) for fmt in READABLE_FORMATS for name in sorted(VECTORS[fmt])])
def test_golden_bytes_decode_to_the_golden_states(fmt: int, name: str) -> None:
    frames = [bytes.fromhex(v["frame"]) for v in VECTORS[fmt][name]]
    states = [bytes.fromhex(v["state"]) for v in VECTORS[fmt][name]]
    start = 0
    for i, frame in enumerate(frames):
        header, _ = parse(frame)
        assert header.format == fmt
        if header.kind is FrameKind.FULL:
            start = i
        assert decode(frames[start : i + 1]) == states[i]
    assert [d.state for d in iter_versions(frames[start:])] == states[start:]


@pytest.mark.parametrize("fmt", READABLE_FORMATS)
def test_vectors_cover_every_frame_shape(fmt: int) -> None:
    shapes = set()
    for vectors in VECTORS[fmt].values():
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


def test_format_2_vectors_are_smaller_by_their_headers() -> None:
    # The same writes, the same payloads: only the headers differ.
    for name, v1 in VECTORS[1].items():
        for old, new in zip(v1, VECTORS[2][name], strict=True):
            h1, p1 = parse(bytes.fromhex(old["frame"]))
            h2, p2 = parse(bytes.fromhex(new["frame"]))
            assert bytes(p1) == bytes(p2) and old["state"] == new["state"]
            assert h1._replace(base_xxh3=0, format=2) == h2
            assert h2.header_size < 64 == h1.header_size
