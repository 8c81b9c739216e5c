"""``ckpt serve`` started by a script that found the ckpt package only through its own sys.path (a
``pip install --target`` folder, a checkout it inserted): the processes the sidecar starts, its store
process and its workers, import that same package, so it serves.

The interpreter is a fresh virtual environment whose only ckpt is the one the script inserts: the
dependencies come from this interpreter's site-packages as plain path entries, whose .pth files (an
editable install of a checkout) do not run.
"""

from __future__ import annotations

import os
import signal
import site
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckpt.sidecar.client import CheckpointClient
from ckpt.sidecar.server.process import wait_until_serving
from tests.support import ROOT, free_port

SERVE_SCRIPT = """
import sys

sys.path.insert(0, {root!r})
import ckpt.command

sys.exit(ckpt.command.main(["serve", *sys.argv[1:]]))
"""


@pytest.fixture(scope="module")
def python_without_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An interpreter with the sidecar's dependencies that cannot import ckpt by default."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    [site_packages] = venv.glob("lib/python*/site-packages")
    (site_packages / "zz_test_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return venv / "bin" / "python"


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def test_the_interpreter_cannot_import_ckpt_by_default(python_without_ckpt: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(python_without_ckpt), "-c", "import grpc, lmdb; import ckpt"],
        cwd=tmp_path,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "No module named 'ckpt'" in proc.stderr


def _serve_and_put(python: Path, cwd: Path, tmp_path: Path, workers: int) -> None:
    """Run the serve script with ``python -I`` in ``cwd``; once it serves, a Put and a Get, then SIGTERM."""
    script = tmp_path / "serve.py"
    script.write_text(SERVE_SCRIPT.format(root=str(ROOT)))
    target = f"unix:{tmp_path / 'ckpt.sock'}" if workers == 1 else f"127.0.0.1:{free_port()}"
    log_path = tmp_path / "serve.log"
    serve_options = ["--data-dir", str(tmp_path / "data"), "--listen", target, "--workers", str(workers)]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(python), "-I", str(script), *serve_options],
            cwd=cwd,
            env=_environment(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, f"ckpt serve exited {process.returncode}:\n{log_path.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"ckpt serve did not serve:\n{log_path.read_text()[-4000:]}"
            try:
                wait_until_serving(target, timeout_seconds=0.5)
                break
            except TimeoutError:
                pass
        with CheckpointClient(target) as client:
            assert client.put("thread", b"\x08\x01").version == 1
            assert client.get("thread").state == b"\x08\x01"
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
    assert code == 0, log_path.read_text()[-4000:]


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_from_a_script_that_put_ckpt_on_its_sys_path_answers_a_put(
    python_without_ckpt: Path, tmp_path: Path, workers: int
) -> None:
    _serve_and_put(python_without_ckpt, tmp_path, tmp_path, workers)


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_in_a_directory_holding_another_ckpt_runs_the_script_s_ckpt(
    python_without_ckpt: Path, tmp_path: Path, workers: int
) -> None:
    """A ckpt/ folder in the working directory (another checkout, say) is not what the children import."""
    cwd = tmp_path / "elsewhere"
    (cwd / "ckpt").mkdir(parents=True)
    (cwd / "ckpt" / "__init__.py").write_text("raise ImportError('the ckpt of the working directory')\n")
    _serve_and_put(python_without_ckpt, cwd, tmp_path, workers)
