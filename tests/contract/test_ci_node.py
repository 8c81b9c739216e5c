""".ci/run's Node.js check (.ci/node.sh): a Node older than clients/node's tools need (Debian 12's 18) is
replaced by node@22 from the npm registry before anything runs on it. Driven with a fake ``node`` and
``npm`` first on PATH."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support import ROOT

NODE_SH = ROOT / ".ci" / "node.sh"


def _fake_tools(tmp_path: Path, version: str, *, npm_installs: str | None) -> dict[str, str]:
    """A ``node`` printing ``version``, an ``npm`` that logs its arguments and, if ``npm_installs``, makes
    ``node`` print that from then on, and a ``sudo`` that logs and runs its arguments; the environment
    with them first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    state = tmp_path / "node-version"
    state.write_text(version + "\n")
    (bin_dir / "node").write_text(f'#!/bin/sh\nread -r v < "{state}"\necho "$v"\n')
    install = f'echo "{npm_installs}" > "{state}"\n' if npm_installs else ""
    (bin_dir / "npm").write_text(f'#!/bin/sh\necho "$@" >> "{tmp_path / "npm.log"}"\n{install}')
    (bin_dir / "sudo").write_text(f'#!/bin/sh\necho sudo >> "{tmp_path / "npm.log"}"\nexec "$@"\n')
    for tool in ("node", "npm", "sudo"):
        (bin_dir / tool).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def _bash(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail; source {NODE_SH}; {script}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("version", "recent"),
    [
        ("v18.0.0", False),
        ("v18.19.0", False),
        ("v20.18.3", False),
        ("v20.19.0", True),
        ("v21.7.3", False),
        ("v22.11.0", False),
        ("v22.12.0", True),
        ("v24.1.0", True),
        ("not a version", False),
    ],
)
def test_node_is_recent_only_from_the_version_vite_and_langchain_need(
    tmp_path: Path, version: str, recent: bool
) -> None:
    env = _fake_tools(tmp_path, version, npm_installs=None)
    proc = _bash("node_is_recent", env)
    assert (proc.returncode, proc.stderr) == (0 if recent else 1, "")


def test_a_debian_12_node_is_replaced_by_node_22_from_npm(tmp_path: Path) -> None:
    env = _fake_tools(tmp_path, "v18.19.0", npm_installs="v22.23.3")
    proc = _bash("ensure_recent_node sudo; node --version", env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "v22.23.3"
    assert "Node.js v18.19.0 is older than clients/node needs" in proc.stdout
    assert (tmp_path / "npm.log").read_text().splitlines() == [
        "sudo",
        "install --global --no-audit --no-fund --loglevel=error node@22",
    ]


def test_the_run_stops_when_the_installed_node_is_still_old(tmp_path: Path) -> None:
    env = _fake_tools(tmp_path, "v18.19.0", npm_installs=None)
    proc = _bash("ensure_recent_node; echo went on", env)
    assert proc.returncode == 1
    assert "went on" not in proc.stdout
    assert "Node.js is still v18.19.0" in proc.stderr


def test_a_recent_node_is_kept(tmp_path: Path) -> None:
    env = _fake_tools(tmp_path, "v20.19.0", npm_installs="v22.23.3")
    proc = _bash("ensure_recent_node", env)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "npm.log").exists()
