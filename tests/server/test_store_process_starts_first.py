"""`ckpt serve` starts its store process before it imports grpc and the server (storespawn.py), so that the
two processes' imports run side by side; the process it started first is the one that serves.

Watched from inside a real `ckpt serve`: a launcher that records, as each store process is started, what
the starting process had imported by then, and then runs the `ckpt` command as `python -m ckpt` does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ckpt.bench.output import child_pids
from ckpt.sidecar.client import CheckpointClient
from ckpt.sidecar.server import start_sidecar_process
from tests.support import ROOT

_LAUNCHER = """
import json, os, runpy, subprocess, sys

_start = subprocess.Popen.__init__


def _recording_start(self, args, *rest, **options):
    _start(self, args, *rest, **options)
    if "ckpt.sidecar.server.storehost" in args:
        imported = sorted(m for m in sys.modules if m == "grpc" or m.startswith("ckpt.sidecar.server."))
        with open(os.environ["STORE_STARTS"], "a") as starts:
            starts.write(json.dumps({"pid": self.pid, "imported": imported}) + "\\n")


subprocess.Popen.__init__ = _recording_start
sys.argv = ["ckpt", "serve", *sys.argv[1:]]
runpy.run_module("ckpt", run_name="__main__", alter_sys=True)
"""


def _launcher(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """The environment that runs ``python -m watched_serve`` (the launcher), and the file it records in."""
    (tmp_path / "launcher").mkdir()
    (tmp_path / "launcher" / "watched_serve.py").write_text(_LAUNCHER)
    starts = tmp_path / "store-starts.jsonl"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'launcher'}{os.pathsep}{ROOT}", "STORE_STARTS": str(starts)}
    return env, starts


def _starts(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_store_process_starts_before_grpc_is_imported_and_is_the_one_that_serves(tmp_path: Path) -> None:
    env, starts = _launcher(tmp_path)
    socket_path = tmp_path / "ckpt.sock"
    sidecar = start_sidecar_process(
        tmp_path / "data", listen=[f"unix:{socket_path}"], env=env, module="watched_serve", cwd=ROOT
    )
    try:
        with CheckpointClient(f"unix:{socket_path}") as client:
            client.put("agent-7", b"\x08\x01")
            assert client.get("agent-7").state == b"\x08\x01"
        [start] = _starts(starts)  # one store process: the one started first was taken over
        assert "grpc" not in start["imported"], start
        assert not {"ckpt.sidecar.server.frontend", "ckpt.sidecar.server.storelink"} & set(start["imported"]), start
        store_pids = [
            pid for pid in child_pids(sidecar.pid) if b"storehost" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]
        assert store_pids == [start["pid"]]
        # Still a session of its own, as when StoreLink.start started it: a Ctrl-C reaches the gRPC process only.
        assert os.getsid(start["pid"]) == start["pid"] != os.getsid(sidecar.pid)
    finally:
        code = sidecar.stop()
    assert code == 0, sidecar.log()


def test_help_and_a_bad_option_start_no_store_process(tmp_path: Path) -> None:
    env, starts = _launcher(tmp_path)
    data_dir = str(tmp_path / "data")
    for args, code, said in [
        (["--help"], 0, "--data-dir"),
        (["--data-dir", data_dir, "--max-message-bytes", "0"], 2, "--max-message-bytes"),
        (["--data-dir", data_dir, "--workers", "0"], 2, "--workers"),
    ]:
        done = subprocess.run(
            [sys.executable, "-m", "watched_serve", *args],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == code, done.stderr
        assert said in done.stdout + done.stderr
        assert _starts(starts) == [], args
