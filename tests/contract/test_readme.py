"""The README's quick start runs as written against a real sidecar, and its set-up commands exist."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ckpt.v1 import checkpoint_pb2 as pb
from tests.support import ROOT, start_sidecar

README = ROOT / "README.md"


def _block(heading: str, language: str) -> str:
    """The first ``language`` code block under ``heading`` in the README."""
    section = README.read_text().split(heading + "\n", 1)[1]
    code = re.search(rf"```{language}\n(.*?)```", section, re.S)
    assert code, f"no {language} block under {heading!r}"
    return code.group(1)


def test_quick_start_runs_against_a_real_sidecar(tmp_path: Path) -> None:
    code = _block("## Quick start (Python)", "python")
    sidecar = start_sidecar(tmp_path / "data")
    try:
        source = code.replace("unix:data/ckpt.sock", sidecar.unix_target)
        assert len(source.strip().splitlines()) <= 12
        namespace: dict[str, Any] = {
            "state": pb.Checkpoint(goal="demo", step=1),
            "patch": pb.Checkpoint(step=2),
        }
        exec(compile(source, "README.md", "exec"), namespace)
        assert pb.Checkpoint.FromString(namespace["latest"]).step == 2
        assert pb.Checkpoint.FromString(namespace["v1"]) == pb.Checkpoint(goal="demo", step=1)
    finally:
        assert sidecar.stop() == 0


def test_set_up_commands_are_make_targets() -> None:
    commands = [line.split("#", 1)[0].split() for line in _block("## Set up", "sh").splitlines() if line.strip()]
    assert [words[0] for words in commands] == ["make", "make"]
    targets = {words[1] for words in commands}
    assert targets == {"run", "test"}
    makefile = (ROOT / "Makefile").read_text()
    for target in targets:
        assert re.search(rf"^{target}:", makefile, re.M), f"the Makefile has no {target!r} target"


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, re.M)
