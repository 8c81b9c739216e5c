"""Run the `ckpt` command as a user runs it: a subprocess of this checkout's code."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.sidecar_proc import ROOT


def ckpt(*args: str, stdin: bytes = b"", env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "ckpt.sidecar.cli", *args],
        input=stdin,
        capture_output=True,
        cwd=ROOT,
        timeout=60,
        env={**os.environ, **(env or {})},
    )
