"""`pip install` of the project (a built wheel, not an editable checkout), then `ckpt bench run --quick`
from outside the repository on a machine without the trajectory corpus: the trajectories workload is
skipped with one line saying how to point at a corpus, the others run, and the report is written.

The wheel is built from a copy of the working tree and installed, without its dependencies, into a fresh
virtual environment; the dependencies come from this interpreter's site-packages, added to the new
environment's path after its own, so ``ckpt`` resolves to the installed wheel and nothing else.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What a wheel is not built from: version control, environments, caches, scratch data, other languages' code.
NOT_BUILT_FROM = frozenset(
    {".git", ".venv", "node_modules", "build", "dist", "data", ".bench-data", ".benchmarks", "clients", "tests"}
)
# Two systems, one concurrency level and one cold round keep the run short; ckpt-sidecar runs the wheel's
# `ckpt serve` too.
QUICK_RUN = (
    *("bench", "run", "--quick", "--no-progress"),
    *("--systems", "ckpt-embedded", "ckpt-sidecar", "--concurrency", "1", "--cold-rounds", "1"),
)


def _not_built_from(directory: str, names: list[str]) -> set[str]:
    top = Path(directory) == ROOT
    return {
        name
        for name in names
        if name == "__pycache__"
        or name.endswith((".egg-info", "_cache"))
        or name.startswith(".hypothesis")
        or (top and name in NOT_BUILT_FROM)
    }


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment holding the project's wheel; returns its bin directory."""
    work = tmp_path_factory.mktemp("installed")
    source = work / "source"
    # A copy, so the build's own build/ and *.egg-info stay out of the checkout; symlinks=True keeps
    # ckpt/codec -> ../codec and the like as links, which setuptools follows into the wheel.
    shutil.copytree(ROOT, source, symlinks=True, ignore=_not_built_from)
    wheels = work / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(wheels), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-4000:]
    [wheel] = wheels.glob("ckpt_sidecar-*.whl")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr[-4000:]
    [site_packages] = venv.glob("lib/python*/site-packages")
    # Plain directories after the venv's own: a .pth line adds a path without running the .pth files in it,
    # so an editable install of the checkout there is not imported.
    (site_packages / "zz_test_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return venv / "bin"


def _environment(**extra: str) -> dict[str, str]:
    """This process's environment, less what would put the checkout on the installed interpreter's path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return {**env, **extra}


def test_the_installed_package_is_the_wheel_not_the_checkout(installed: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(installed / "python"), "-c", "import ckpt.bench.harness.main as m; print(m.__file__)"],
        cwd=tmp_path,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).is_relative_to(installed.parent)


def test_a_quick_run_without_the_corpus_skips_trajectories_in_one_line_and_writes_the_report(
    installed: Path, tmp_path: Path
) -> None:
    empty_corpus = tmp_path / "no-corpus"
    empty_corpus.mkdir()
    out = tmp_path / "out"
    proc = subprocess.run(
        [str(installed / "ckpt"), *QUICK_RUN, "--out", str(out)],
        cwd=tmp_path,
        env=_environment(CKPT_TRAJECTORIES=str(empty_corpus), CKPT_BENCH_DIR=str(tmp_path / "scratch")),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr
    [skip] = [line for line in proc.stderr.splitlines() if "trajector" in line.lower()]
    assert skip.startswith("ckpt bench run: skipping the trajectories workload: no *.jsonl files")
    assert "--trajectories DIR" in skip and "$CKPT_TRAJECTORIES" in skip

    doc = json.loads((out / "results.json").read_text())
    assert doc["config"]["workloads"] == ["chat", "coding", "factual", "large"]
    assert doc["skipped_workloads"] == {"trajectories": skip.split(": ", 2)[2]}
    assert {r["workload"] for r in doc["records"]} == {"chat", "coding", "factual", "large"}
    assert [sweep["workload"] for sweep in doc["tuning"]] == ["factual"]
    report = (out / "REPORT.md").read_text()
    assert "**Skipped:** the trajectories workload: no *.jsonl files" in report
    for heading in ("## Bytes per checkpoint", "## Write throughput", "## Hydrate latency", "## Tuning"):
        assert heading in report
    assert sorted(p.name for p in (out / "plots").iterdir()) == sorted(
        ["bytes_per_checkpoint.png", "throughput_by_concurrency.png", "cold_hydrate_cdf.png", "tuning_curve.png"]
    )
