"""The harness's quick run, driven as a user runs it: `ckpt bench run --quick`, then `ckpt bench report`.

This keeps the harness from rotting: every workload and every system goes
through writes at each concurrency, hot/cold/old reads (each value checked
against the workload's state) and the tuning sweep, and the report and plots
are written. Figures are not asserted (machines are noisy); their presence and
coherence are.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SYSTEMS = (
    "ckpt-embedded",
    "ckpt-sidecar",
    "json-sqlite",
    "pbzstd-lmdb",
    "langgraph-sqlite",
    "langgraph-lmdb",
    "langgraph-memory",
)
WORKLOADS = ("trajectories", "chat", "coding", "factual", "large")
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench-quick")
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt", "bench", "run", "--quick", "--no-progress", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "CKPT_BENCH_DIR": str(out / "scratch")},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def test_quick_run_measures_every_system_on_every_workload(quick_run: Path) -> None:
    doc = json.loads((quick_run / "results.json").read_text())
    assert doc["config"]["quick"] is True
    assert set(doc["config"]["systems"]) == set(SYSTEMS)
    assert set(doc["workloads"]) == set(WORKLOADS)
    assert doc["machine"]["cores"] >= 1 and doc["machine"]["versions"]["langgraph-checkpoint-sqlite"]
    have = {(r["system"], r["workload"], r["metric"], r.get("agents")) for r in doc["records"]}
    for system in SYSTEMS:
        for workload in WORKLOADS:
            levels = (1,) if workload == "large" else (1, 8, 64)
            for agents in levels:
                assert (system, workload, "write_throughput", agents) in have, (system, workload, agents)
                assert (system, workload, "write_latency", agents) in have
            assert (system, workload, "hydrate_latest_hot", None) in have
            if system != "langgraph-memory":  # in-memory: nothing to reopen
                assert (system, workload, "hydrate_latest_cold", None) in have
                assert (system, workload, "hydrate_old_cold", None) in have
                assert (system, workload, "disk_bytes", None) in have
    for r in doc["records"]:
        assert r["value"] >= 0, r
        if r["unit"] == "us" and "p99_us" in r:
            assert r["p50_us"] <= r["p99_us"]
            assert 0 < len(r["samples_us"]) <= min(r["count"], 501)
    # ckpt stores deltas: on an append-only workload it must beat a full zstd snapshot per step.
    disk = {
        r["system"]: r["value"]
        for r in doc["records"]
        if r["workload"] == "chat" and r["metric"] == "stored_bytes_per_checkpoint"
    }
    assert disk["ckpt-embedded"] < disk["pbzstd-lmdb"]
    assert [sweep["workload"] for sweep in doc["tuning"]] == ["trajectories", "factual"]
    for sweep in doc["tuning"]:
        knobs = {p["knob"] for p in sweep["points"]}
        assert knobs == {"level", "max_decode_cost_ratio", "max_depth", "merge_message_type"}
        assert sum(p["default"] for p in sweep["points"]) == 3  # the default is one point of each knob's curve
        # Fewer frames per chain never save bytes: the shallowest max_depth stores at least as much per version.
        depths = sorted((p["value"], p["bytes_per_version"]) for p in sweep["points"] if p["knob"] == "max_depth")
        assert depths[0][1] >= depths[-1][1]
    # Compaction never costs bytes (it runs at chain starts, which the quick run's short sessions may not
    # reach; tests/store/test_store.py shows the saving on long ones).
    factual = next(sweep["points"] for sweep in doc["tuning"] if sweep["workload"] == "factual")
    compacted = next(p for p in factual if p["knob"] == "merge_message_type")
    default = next(p for p in factual if p["default"])
    assert compacted["label"] == "ckpt.v1.Checkpoint"
    assert compacted["bytes_per_version"] <= default["bytes_per_version"]


def test_quick_run_writes_the_report_and_plots(quick_run: Path) -> None:
    report = (quick_run / "REPORT.md").read_text()
    for heading in ("## Headline", "## Bytes per checkpoint", "## Write throughput", "## Hydrate latency", "## Tuning"):
        assert heading in report
    assert "**Machine:**" in report
    plots = sorted(p.name for p in (quick_run / "plots").iterdir())
    assert plots == sorted(
        ["bytes_per_checkpoint.png", "throughput_by_concurrency.png", "cold_hydrate_cdf.png", "tuning_curve.png"]
    )
    for name in plots:
        assert (quick_run / "plots" / name).read_bytes().startswith(PNG)
        assert f"plots/{name}" in report


def test_report_rerenders_from_results_alone(quick_run: Path, tmp_path: Path) -> None:
    (tmp_path / "results.json").write_bytes((quick_run / "results.json").read_bytes())
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt", "bench", "report", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "REPORT.md").read_text() == (quick_run / "REPORT.md").read_text()


def test_unknown_system_is_refused_with_its_name(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ckpt",
            "bench",
            "run",
            "--quick",
            "--systems",
            "nope",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "nope" in proc.stderr


@pytest.mark.parametrize(
    "asked",
    [("--workload", "trajectories"), ("--workload", "chat", "--trajectories", "no-such-corpus")],
    ids=["the-workload-by-name", "a-corpus-by-path"],
)
def test_asking_for_trajectories_without_a_corpus_is_refused_in_one_line(
    tmp_path: Path, asked: tuple[str, ...]
) -> None:
    """Without a corpus the trajectories workload is skipped (tests/bench/test_bench_installed.py), unless
    the command line asked for it: then the run stops before measuring anything and says why."""
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt", "bench", "run", "--quick", *asked, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CKPT_TRAJECTORIES": str(empty)},
    )
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("ckpt bench run: no *.jsonl files in trajectory corpus")
    assert "--trajectories DIR" in line and "$CKPT_TRAJECTORIES" in line
    assert not (out / "results.json").exists()
