"""The committed stubs in ckpt/v1 are exactly what scripts/gen_stubs.py makes from proto/."""

from __future__ import annotations

import importlib.util
import re
import tomllib
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


def _declared_floor(package: str) -> tuple[int, ...]:
    """The lowest version of ``package`` pyproject.toml's dependencies allow (its ``>=`` bound)."""
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    [spec] = [d for d in dependencies if re.match(rf"{re.escape(package)}\s*[<>=!~;,\[]", d)]
    floor = re.search(r">=\s*([0-9][0-9.]*)", spec)
    assert floor, f"{spec!r} declares no lower bound"
    return _version(floor.group(1))


def _version(text: str) -> tuple[int, ...]:
    parts = [int(part) for part in text.strip(".").split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def _generated_files(pattern: str) -> list[Path]:
    files = [p for sub in GENERATED for p in (ROOT / "ckpt" / sub).rglob(pattern)]
    assert files, f"no generated {pattern} in ckpt/"
    return files


def test_declared_grpcio_floor_is_the_version_the_stubs_need() -> None:
    """Each *_pb2_grpc.py raises at import on a grpcio older than its GRPC_GENERATED_VERSION."""
    floor = _declared_floor("grpcio")
    for path in _generated_files("*_pb2_grpc.py"):
        found = re.search(r"^GRPC_GENERATED_VERSION = '([0-9.]+)'", path.read_text(), re.MULTILINE)
        assert found, f"no GRPC_GENERATED_VERSION in {path}"
        needed = _version(found.group(1))
        assert floor >= needed, (
            f"pyproject.toml allows grpcio {floor}, but {path.relative_to(ROOT)} needs grpcio>={found.group(1)}"
        )


def test_declared_protobuf_floor_is_the_version_the_stubs_need() -> None:
    """Each *_pb2.py refuses at import a protobuf runtime older than the one it was generated for."""
    floor = _declared_floor("protobuf")
    for path in _generated_files("*_pb2.py"):
        found = re.search(r"ValidateProtobufRuntimeVersion\(\s*\S+,\s*(\d+),\s*(\d+),\s*(\d+),", path.read_text())
        assert found, f"no ValidateProtobufRuntimeVersion call in {path}"
        needed = tuple(int(part) for part in found.groups())
        assert floor >= needed, (
            f"pyproject.toml allows protobuf {floor}, but {path.relative_to(ROOT)} needs protobuf>={needed}"
        )
