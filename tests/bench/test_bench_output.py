"""The benchmark scripts' shared tail: print, save as JSON, exit by the checks; and the /proc CPU reader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ckpt.bench.output import finish, proc_cpu_seconds, process_and_children, tree_cpu_seconds


@dataclass
class _Report:
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)


@pytest.mark.parametrize(("oks", "code"), [([True, True], 0), ([True, False], 1), ([], 0)])
def test_finish_prints_saves_and_exits_by_the_checks(
    oks: list[bool], code: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _Report({f"c{i}": {"ok": ok} for i, ok in enumerate(oks)})
    out = tmp_path / "r.json"
    assert finish(report, "the table", str(out)) == code
    assert capsys.readouterr().out == "the table\n"
    assert json.loads(out.read_text()) == {"checks": report.checks}
    assert finish(report, "again", None) == code  # no JSON asked for: nothing written
    assert json.loads(out.read_text()) == {"checks": report.checks}


def test_proc_cpu_seconds_of_this_process_a_zombie_and_a_missing_one() -> None:
    mine = proc_cpu_seconds(os.getpid())
    assert mine is not None and mine > 0
    child = subprocess.Popen([sys.executable, "-c", "sum(range(3_000_000))"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie keeps its times
    zombie = proc_cpu_seconds(child.pid)
    assert zombie is not None and zombie > 0
    child.wait()
    assert proc_cpu_seconds(child.pid) is None


def test_tree_cpu_seconds_keeps_the_cpu_of_a_child_that_exited() -> None:
    # A parent that runs a busy child to its end (reaping it), then waits to be told to exit.
    script = (
        "import subprocess, sys\n"
        "subprocess.run([sys.executable, '-c', 'sum(range(30_000_000))'], check=True)\n"
        "print('done', flush=True)\n"
        "sys.stdin.read()\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None and parent.stdout.readline() == b"done\n"
        assert process_and_children(parent.pid) == [parent.pid]  # the child is gone
        own = proc_cpu_seconds(parent.pid)
        assert own is not None
        assert tree_cpu_seconds(parent.pid) > own + 0.1  # the child's CPU is still counted
    finally:
        parent.communicate(b"")
    assert tree_cpu_seconds(parent.pid) == 0.0
