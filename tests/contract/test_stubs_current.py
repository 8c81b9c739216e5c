"""The committed stubs in ckpt/v1 are exactly what scripts/gen_stubs.py makes from proto/."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("v1", "store", "langgraph")  # ckpt/'s generated sub-packages; the rest of ckpt/ is hand-written


def _load_generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_stubs", ROOT / "scripts" / "gen_stubs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_stubs_match_proto(tmp_path: Path) -> None:
    gen = _load_generator()
    fresh = {p.relative_to(tmp_path): p.read_bytes() for p in gen.generate(tmp_path)}
    committed = {
        p.relative_to(ROOT): p.read_bytes()
        for sub in GENERATED
        for p in (ROOT / "ckpt" / sub).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert sorted(committed) == sorted(fresh), "stub files differ: run `make stubs` and commit"
    stale = [str(path) for path, data in fresh.items() if committed[path] != data]
    assert not stale, f"stubs out of date with proto/: {stale}; run `make stubs` and commit"


def test_every_proto_has_stubs() -> None:
    protos = sorted((ROOT / "proto").rglob("*.proto"))
    assert protos
    for proto in protos:
        stem = proto.relative_to(ROOT / "proto").with_suffix("")
        assert (ROOT / f"{stem}_pb2.py").is_file(), f"no stub for {proto}"
