"""Regenerate the committed Python protobuf/gRPC stubs from proto/.

    python scripts/gen_stubs.py            # rewrite ckpt/v1/*_pb2*.py{,i}
    python scripts/gen_stubs.py --out DIR  # write them under DIR instead

The stubs are generated with the pinned grpcio-tools (see pyproject.toml's
`dev` extra) so that the output is byte-for-byte reproducible;
tests/test_stubs_current.py regenerates into a temporary directory and fails
when the committed files differ.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE = "ckpt"  # the Python package of proto package ckpt.v1
PACKAGE_INIT = '"""Generated protobuf/gRPC stubs for proto/ckpt/v1 (do not edit; see scripts/gen_stubs.py)."""\n'


def proto_files() -> list[Path]:
    return sorted(PROTO_ROOT.rglob("*.proto"))


def generate(out_root: Path) -> list[Path]:
    """Run protoc on every file under proto/ and write the stubs under out_root.

    protoc writes into a fresh temporary directory first; only the generated
    sub-packages of `ckpt/` are then copied to out_root (replacing the old ones), so
    stale stubs of deleted .proto files do not survive a regeneration.
    """
    from grpc_tools import protoc  # dev-only dependency, imported lazily

    well_known = resources.files("grpc_tools") / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        tmp_dir = Path(tmp)
        args = [
            "grpc_tools.protoc",
            f"--proto_path={PROTO_ROOT}",
            f"--proto_path={well_known}",
            f"--python_out={tmp_dir}",
            f"--pyi_out={tmp_dir}",
            f"--grpc_python_out={tmp_dir}",
            *(str(p.relative_to(PROTO_ROOT)) for p in proto_files()),
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed; see its message above")
        package = tmp_dir / PACKAGE
        written: list[Path] = []
        # ckpt/ itself is hand-written (the namespace's __init__, py.typed, the links to codec/, sidecar/
        # and bench/): only its generated sub-packages (v1/, store/) are replaced.
        for generated in sorted(d for d in package.iterdir() if d.is_dir()):
            for d in [generated, *(p for p in generated.rglob("*") if p.is_dir())]:
                (d / "__init__.py").write_text(PACKAGE_INIT)
            target = out_root / PACKAGE / generated.name
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(generated, target)
            written += (p for p in target.rglob("*") if p.is_file())
    return sorted(written)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT, help="output root (default: the repository root)")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path.relative_to(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
