"""The README's Python example runs as written against a real sidecar."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ckpt.v1 import checkpoint_pb2 as pb
from tests.sidecar_proc import ROOT, start_sidecar


def test_readme_python_example_runs(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Use it from an agent (Python)", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code, "no python block in the README's client section"
    sidecar = start_sidecar(tmp_path / "data")
    try:
        source = code.group(1).replace("unix:data/ckpt.sock", sidecar.unix_target)
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
