"""The LangGraph savers benchmark, run at its smoke size as a user runs it (`ckpt bench langgraph --smoke`),
every saver included (PostgreSQL started from its binaries), and its section of REPORT.md.

Figures are not asserted (machines are noisy); their presence, their coherence and the goals' arithmetic are.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ckpt.bench import langgraph_replay, postgres_server, trajectories
from ckpt.bench.langgraph_bench import BYTES_TARGET, LATENCY_TARGET

ROOT = Path(__file__).resolve().parents[2]
SYSTEMS = ["ckpt-sidecar", "ckpt-embedded", "sqlite", "lmdb", "postgres"]
OPS = ("put", "put_writes", "get_tuple")


@pytest.fixture(scope="module")
def smoke_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("langgraph-smoke")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ckpt",
            "bench",
            "langgraph",
            "--smoke",
            "--out",
            str(out),
            "--data-dir",
            str(out / "s"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    (out / "stdout.txt").write_text(proc.stdout)
    return out


def _doc(out: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((out / "langgraph.json").read_text())
    return doc


def test_smoke_run_replays_the_same_calls_against_every_saver_and_judges_the_goals(smoke_out: Path) -> None:
    doc = _doc(smoke_out)
    cfg = doc["config"]
    assert cfg["smoke"] is True and cfg["rounds"] == 1 and cfg["threads"] == 4 and cfg["steps"] == 12
    assert cfg["checkpoints_many"] == cfg["threads"] * cfg["steps"]
    assert cfg["checkpoints_x1"] == cfg["x1_threads"] * cfg["steps"]
    assert list(doc["systems"]) == SYSTEMS
    for name, system in doc["systems"].items():
        (only,) = system["rounds"]
        assert system["median"] == {k: v for k, v in only.items() if isinstance(v, (int, float))}
        for phase, checkpoints in (("x1", cfg["checkpoints_x1"]), ("many", cfg["checkpoints_many"])):
            # One get_tuple after each put; put_writes as LangGraph's loop made them.
            assert only[f"put_calls_{phase}"] == only[f"get_tuple_calls_{phase}"] == checkpoints, name
            assert only[f"put_writes_calls_{phase}"] > 0
            for op in OPS:
                assert 0 < only[f"{op}_p50_us_{phase}"] <= only[f"{op}_p99_us_{phase}"], (name, op, phase)
        assert only["bytes_per_checkpoint"] == pytest.approx(only["footprint_bytes"] / cfg["checkpoints_many"])
        assert 0 < only["history_p50_ms"] <= only["history_max_ms"]
    assert doc["systems"]["postgres"]["settings"]["synchronous_commit"] == "on"
    assert doc["systems"]["sqlite"]["settings"]["journal_mode"] == "wal"
    assert set(doc["systems"]["postgres"]["median"]) >= {"bytes_per_checkpoint", "put_p50_us_many"}
    tables = doc["systems"]["postgres"]["rounds"][0]["footprint"]["table_bytes"]
    assert sum(tables.values()) == doc["systems"]["postgres"]["median"]["footprint_bytes"]
    figures = {name: s["median"] for name, s in doc["systems"].items()}
    goals = doc["goals"]
    assert len(goals) == 2 * 3 + 2 * 4  # bytes: 2 ckpt savers x 3 peers; latency: 2 pairs x 2 ops x 2 phases
    for g in goals:
        ours, peer = figures[g["ckpt"]][g["metric"]], figures[g["peer"]][g["metric"]]
        if g["metric"] == "bytes_per_checkpoint":
            assert g["ratio"] == pytest.approx(peer / ours) and g["holds"] == (g["ratio"] >= BYTES_TARGET)
        else:
            assert (g["ckpt"], g["peer"]) in {("ckpt-sidecar", "postgres"), ("ckpt-embedded", "sqlite")}
            assert g["ratio"] == pytest.approx(ours / peer) and g["holds"] == (g["ratio"] <= LATENCY_TARGET)
    printed = (smoke_out / "stdout.txt").read_text()
    assert printed.startswith("## LangGraph savers") and "| goal | ckpt | against |" in printed
    for name, median in figures.items():
        assert median["process_cpu_us_per_put_many"] > 0, name
        # The servers' CPU is counted for the savers that have one, and only for them.
        assert ("server_cpu_us_per_put_many" in median) == (name in ("ckpt-sidecar", "postgres")), name
    assert figures["ckpt-sidecar"]["server_cpu_us_per_put_many"] > 0 < figures["postgres"]["server_cpu_us_per_put_many"]


def test_smoke_run_measures_the_floors_beside_the_savers(smoke_out: Path) -> None:
    doc = _doc(smoke_out)
    floors, embedded = doc["floors"], doc["systems"]["ckpt-embedded"]["median"]
    assert floors["lmdb_commit_value_bytes"] == int(embedded["bytes_per_checkpoint"])
    assert floors["embedded_put_floor_us"] == pytest.approx(
        floors["serialize_changed_p50_us"] + floors["lmdb_commit_p50_us"]
    )
    sqlite = doc["systems"]["sqlite"]["median"]
    assert floors["sqlite_commit_value_bytes"] == int(sqlite["bytes_per_checkpoint"])
    assert floors["sqlite_put_floor_us"] == pytest.approx(
        floors["serialize_whole_p50_us"] + floors["sqlite_commit_p50_us"]
    )
    for key in ("serialize_whole_p50_us", "lmdb_commit_p50_us", "sqlite_commit_p50_us", "grpc_call_p50_us"):
        assert floors[key] > 0, key
    assert floors["psycopg_call_p50_us"] > 0
    for call in ("grpc_call", "psycopg_call"):
        assert floors[f"{call}_thread_cpu_us"] > 0, call
    # Each saver's puts split, timed inside them: a put takes at least each of its parts.
    for prefix in ("embedded", "sqlite"):
        parts = {part: floors[f"{prefix}_split_{part}_p50_us"] for part in ("put", "serializer", "commit", "rest")}
        assert parts["serializer"] > 0 and parts["commit"] > 0 and parts["rest"] >= 0, (prefix, parts)
        assert parts["put"] >= max(parts["serializer"], parts["commit"], parts["rest"]), (prefix, parts)
    printed = (smoke_out / "stdout.txt").read_text()
    assert "Floors (`bench/langgraph_floors.py`" in printed
    assert "The same puts split" in printed and "SqliteSaver's put" in printed
    assert "an embedded put cannot take less than their sum" in printed and "psycopg's `SELECT 1`" in printed
    assert "SqliteSaver's put, the same way" in printed and "ckpt embedded's floor is" in printed
    assert not any((smoke_out / "s").iterdir())  # the scratch stores (and the PostgreSQL cluster) are gone


def test_report_renders_the_langgraph_section_when_langgraph_json_is_beside_the_results(smoke_out: Path) -> None:
    out = smoke_out / "report"
    out.mkdir()
    shutil.copy(ROOT / "bench" / "results.json", out / "results.json")
    shutil.copy(smoke_out / "langgraph.json", out / "langgraph.json")
    render = [sys.executable, "-m", "ckpt", "bench", "report", "--out", str(out)]
    proc = subprocess.run(render, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = (out / "REPORT.md").read_text()
    assert report.count("## LangGraph savers") == 1
    lines = report.split("## LangGraph savers", 1)[1].split("\n## ", 1)[0].splitlines()
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("|")]
    assert rows[0] == ["figure", "ckpt sidecar", "ckpt embedded", "SqliteSaver", "LMDBSaver", "PostgresSaver"]
    doc = _doc(smoke_out)
    verdicts = [row for row in rows if row[-1] in ("yes", "no")]
    assert [row[-1] for row in verdicts] == ["yes" if g["holds"] else "no" for g in doc["goals"]]
    assert [row[3] for row in verdicts] == [f"{g['ratio']:.2f}x" for g in doc["goals"]]


def test_the_recorded_graph_writes_one_checkpoint_per_message_plus_its_input() -> None:
    corpus = trajectories.load()
    (rec,) = langgraph_replay.record(corpus, threads=1, steps=7, prefix="t")
    puts = [c for c in rec.calls if isinstance(c, langgraph_replay.Put)]
    assert len(puts) == 7 and rec.messages == 6
    assert [p.metadata["step"] for p in puts] == list(range(-1, 6))
    # Each put names its parent, the checkpoint put before it, as LangGraph's loop does.
    assert [p.config["configurable"].get("checkpoint_id") for p in puts[1:]] == [p.checkpoint["id"] for p in puts[:-1]]
    messages = puts[-1].checkpoint["channel_values"]["messages"]
    want = langgraph_replay.feed(corpus, 0, 6)
    assert [m.content for m in messages] == [m.get("content") or "" for m in want]
    # No run-time objects in what is replayed: a config is plain data.
    assert all(not k.startswith("__") for c in rec.calls for k in c.config["configurable"])


def test_missing_postgres_binaries_are_named_with_how_to_install_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(postgres_server.ENV_VAR, "/nonexistent/pg/bin")
    with pytest.raises(postgres_server.PostgresMissing, match=r"apt-get install postgresql"):
        postgres_server.find_bin_dir()
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt.bench.langgraph_bench", "--smoke"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, postgres_server.ENV_VAR: "/nonexistent/pg/bin"},
    )
    assert proc.returncode == 2
    assert "PostgreSQL server binaries not found" in proc.stderr and "/nonexistent/pg/bin" in proc.stderr


def test_the_put_split_times_the_serializer_without_changing_the_path_a_put_takes() -> None:
    # A timing subclass of JsonPlusSerializer would send ckpt's put down the element-by-element path, which
    # its default serializer does not take: the split times the class's own method instead.
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from ckpt.bench.langgraph_split import _SerializerTimer
    from ckpt.sidecar.langgraph.elements import Elements

    values = [f"message {i}" for i in range(40)]
    with _SerializerTimer() as timer:
        codec = Elements(JsonPlusSerializer())
        pairs = codec.dumps_after(values, codec.dumps(values[:39]))
        assert pairs == codec.dumps(values)
        assert timer.ns > 0
    assert JsonPlusSerializer.dumps_typed.__name__ == "dumps_typed"  # the class's own again
