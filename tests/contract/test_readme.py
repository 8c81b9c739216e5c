"""The README's Python example runs as written against a real sidecar."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ckpt.v1 import checkpoint_pb2 as pb
from tests.sidecar_proc import ROOT, start_sidecar


def _python_block(heading: str) -> str:
    section = (ROOT / "README.md").read_text().split(heading, 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code, f"no python block under {heading!r}"
    return code.group(1)


def test_readme_python_example_runs(tmp_path: Path) -> None:
    code = _python_block("## Use it from an agent (Python)")
    sidecar = start_sidecar(tmp_path / "data")
    try:
        source = code.replace("unix:data/ckpt.sock", sidecar.unix_target)
        assert len(source.strip().splitlines()) <= 12
        namespace: dict[str, Any] = {
            "state": pb.Checkpoint(goal="demo", step=1),
            "patch": pb.Checkpoint(step=2),
            "print": lambda *a: None,
        }
        exec(compile(source, "README.md", "exec"), namespace)
        assert pb.Checkpoint.FromString(namespace["latest"]).step == 2
    finally:
        assert sidecar.stop() == 0


def test_readme_store_example_runs_on_a_fresh_data_directory(tmp_path: Path) -> None:
    source = _python_block("## The store (embedded)").replace('Path("data")', f"Path({str(tmp_path / 'data')!r})")
    state = pb.Checkpoint(goal="demo", step=1).SerializeToString()
    patch = pb.Checkpoint(step=2).SerializeToString()
    namespace: dict[str, Any] = {"state_bytes": state, "patch_bytes": patch}
    exec(compile(source, "README.md", "exec"), namespace)
    assert namespace["latest"].state == state + patch
    assert namespace["v1"].state == state
    assert [v.version for v in namespace["page"]] == [2, 1]


def test_readme_codec_example_runs() -> None:
    source = _python_block("## The codec in ten lines")
    states = [pb.Checkpoint(goal="demo", step=n, conversation_summary="x" * n).SerializeToString() for n in range(30)]
    stored: dict[int, bytes] = {}
    namespace: dict[str, Any] = {"states": states, "store": stored.__setitem__}
    exec(compile(source, "README.md", "exec"), namespace)
    assert sorted(stored) == list(range(1, 31))
