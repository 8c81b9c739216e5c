"""The Python example of docs/langgraph.md runs as printed, against a real sidecar."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.support import ROOT, Sidecar


def test_the_python_example_of_the_langgraph_page_runs(sidecar: Sidecar) -> None:
    page = (ROOT / "docs" / "langgraph.md").read_text()
    example = re.search(r"```python\n(.*?)```", page, re.S)
    assert example, "docs/langgraph.md lost its Python example"
    code = example.group(1).replace('"unix:data/ckpt.sock"', repr(sidecar.unix_target))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["approved: yes", "1 ()", "0 ('agent',)", "-1 ('__start__',)"]
