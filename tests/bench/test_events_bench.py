"""The event log benchmark, run quick as a user runs it (`python -m ckpt.bench.events_bench --quick`), and its
section of REPORT.md (`ckpt bench report`); its workload and its read check on their own.

Figures are not asserted (machines are noisy); their presence, their coherence and the goals' arithmetic are.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ckpt.bench import events_bench, trajectories
from ckpt.bench.events_replay import Event, SessionLog, corpus_logs, event_of, many_writer_sessions
from ckpt.bench.events_systems import SqliteEvents

ROOT = Path(__file__).resolve().parents[2]
SYSTEMS = {"ckpt-sidecar", "ckpt-embedded", "sqlite"}
PHASE_KEYS = ("appends_per_s", "append_p50_us", "append_p99_us", "disk_bytes", "bytes_per_event")


@pytest.fixture(scope="module")
def quick_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("events-quick")
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt.bench.events_bench", "--quick", "--out", str(out), "--data-dir", str(out / "s")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    (out / "stdout.txt").write_text(proc.stdout)
    return out


def _doc(out: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((out / "events.json").read_text())
    return doc


def test_quick_run_measures_every_system_and_judges_the_goals_from_its_medians(quick_out: Path) -> None:
    doc = _doc(quick_out)
    cfg = doc["config"]
    assert cfg["quick"] is True and cfg["rounds"] == 1 and cfg["writers"] == 8 and cfg["read_last"] == 50
    assert cfg["events_x1"] == doc["workload"]["events"] > 0
    # Every writer had two sessions at least; the repeated corpus is a whole number of copies.
    assert cfg["sessions_many"] >= 2 * cfg["writers"] and cfg["sessions_many"] % cfg["sessions_x1"] == 0
    assert cfg["events_many"] == cfg["events_x1"] * cfg["sessions_many"] // cfg["sessions_x1"]
    assert set(doc["systems"]) == SYSTEMS
    for name, system in doc["systems"].items():
        (only,) = system["rounds"]
        assert system["median"] == {k: v for k, v in only.items() if isinstance(v, (int, float))}
        for phase, events in (("x1", cfg["events_x1"]), ("many", cfg["events_many"])):
            for key in PHASE_KEYS:
                assert only[f"{key}_{phase}"] > 0, (name, key, phase)
            assert only[f"append_p50_us_{phase}"] <= only[f"append_p99_us_{phase}"]
            assert only[f"bytes_per_event_{phase}"] == pytest.approx(only[f"disk_bytes_{phase}"] / events)
        assert 0 < only["cold_p50_us"] <= only["cold_p99_us"]
    sqlite = doc["systems"]["sqlite"]
    assert sqlite["settings"]["journal_mode"] == "wal" and sqlite["settings"]["synchronous"] == 2  # FULL
    assert sqlite["rounds"][0]["disk_many"]["wal_bytes"] == 0  # checkpointed (TRUNCATE) before counting
    for name in ("ckpt-sidecar", "ckpt-embedded"):
        disk = doc["systems"][name]["rounds"][0]["disk_many"]
        # The event blocks sit in the events table's pages, which sit in the file.
        assert 0 < disk["event_blocks_bytes"] <= disk["table_pages_bytes"]["events"] <= disk["used_pages_bytes"]
        assert disk["used_pages_bytes"] <= doc["systems"][name]["median"]["disk_bytes_many"]
    ckpt, peer = doc["systems"]["ckpt-sidecar"]["median"], sqlite["median"]
    goals = {g["metric"]: g for g in doc["goals"]}
    assert goals["bytes_per_event_many"]["ratio"] == pytest.approx(
        peer["bytes_per_event_many"] / ckpt["bytes_per_event_many"]
    )
    assert goals["appends_per_s_many"]["ratio"] == pytest.approx(
        ckpt["appends_per_s_many"] / peer["appends_per_s_many"]
    )
    assert goals["cold_p50_us"]["ratio"] == pytest.approx(ckpt["cold_p50_us"] / peer["cold_p50_us"])
    assert goals["bytes_per_event_many"]["holds"] == (goals["bytes_per_event_many"]["ratio"] >= 3)
    assert goals["appends_per_s_many"]["holds"] == (goals["appends_per_s_many"]["ratio"] >= 2)
    assert goals["cold_p50_us"]["holds"] == (goals["cold_p50_us"]["ratio"] <= 1)
    printed = (quick_out / "stdout.txt").read_text()
    assert all(f"goal {metric}:" in printed for metric in goals)
    # The scratch stores are gone.
    assert not any((quick_out / "s").iterdir())


def _section(report: str) -> list[str]:
    assert report.count("## Event log against SQLite") == 1
    return report.split("## Event log against SQLite", 1)[1].split("\n## ", 1)[0].splitlines()


def test_report_renders_the_events_section_when_events_json_is_beside_the_results(quick_out: Path) -> None:
    out = quick_out / "report"
    out.mkdir()
    shutil.copy(ROOT / "bench" / "results.json", out / "results.json")
    render = [sys.executable, "-m", "ckpt", "bench", "report", "--out", str(out)]
    proc = subprocess.run(render, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Event log against SQLite" not in (out / "REPORT.md").read_text()

    shutil.copy(quick_out / "events.json", out / "events.json")
    proc = subprocess.run(render, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = _section((out / "REPORT.md").read_text())
    doc = _doc(quick_out)
    assert any(doc["command"] in line and "--quick: small sizes" in line for line in lines)
    table = [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("|")]
    header, rule, *rows = table
    assert header == ["figure", "ckpt sidecar", "ckpt embedded", "SQLite events table", "ratio", "goal", "holds"]
    assert all(set(c) <= {"-", ":"} for c in rule)
    assert all(len(row) == len(header) for row in rows)
    by_figure = {row[0]: row for row in rows}
    goals = {g["metric"]: g for g in doc["goals"]}
    for figure, metric in (
        ("bytes / event on disk, x8 run", "bytes_per_event_many"),
        ("appends/s x8", "appends_per_s_many"),
        ("cold read of the last 50, p50", "cold_p50_us"),
    ):
        goal = goals[metric]
        verdict = "yes" if goal["holds"] else "no"
        assert by_figure[figure][4:] == [f"{goal['ratio']:.2f}x", f"{goal['target']}x", verdict]
    median = doc["systems"]["sqlite"]["median"]
    assert by_figure["appends/s x1"][3] == f"{median['appends_per_s_x1']:,.0f}"
    assert sum(row[6] in ("yes", "no") for row in rows) == 3


def test_a_read_that_misses_an_event_or_returns_other_bytes_is_caught(tmp_path: Path) -> None:
    system = SqliteEvents()
    system.open(tmp_path)
    log = SessionLog("s", tuple(Event("user", f'{{"n":{i}}}'.encode(), {}) for i in range(60)))
    appender = system.appender()
    for seq, item in enumerate(log.events[:-1], start=1):  # the last event never appended
        appender.append(log.session_id, seq, item)
    appender.close()
    system.close()
    system.reopen()
    try:
        got = system.read_last("s", events_bench.READ_LAST)
        assert [system.seq_and_payload(row)[0] for row in got] == list(range(59, 9, -1))
        with pytest.raises(AssertionError, match="newest 50 events of s came back wrong"):
            events_bench.check_read(system, log, got)
        short = SessionLog("s", log.events[:-1])
        events_bench.check_read(system, short, got)
        other = SessionLog("s", (*short.events[:-1], Event("user", b'{"n":"other"}', {})))
        with pytest.raises(AssertionError):
            events_bench.check_read(system, other, got)
    finally:
        system.shutdown()


def test_each_message_becomes_one_event_typed_by_its_kind_with_its_json_as_payload() -> None:
    call = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "grep", "arguments": "{}"}}]}
    assert event_of(call) == Event("tool_call", json.dumps(call, separators=(",", ":")).encode(), {"tool": "grep"})
    assert event_of({"role": "tool", "name": "grep", "content": "x"}).type == "tool_result"
    assert event_of({"role": "tool", "name": "grep", "content": "x"}).attributes == {"tool": "grep"}
    assert event_of({"role": "user", "content": "é"}) == Event("user", '{"role":"user","content":"é"}'.encode(), {})


@pytest.mark.parametrize("writers", [1, 8, 64])
def test_many_writers_get_two_sessions_each_from_whole_copies_of_the_corpus_longest_first(writers: int) -> None:
    logs = corpus_logs(trajectories.load(), quick=False)
    sessions = many_writer_sessions(logs, writers, "p")
    assert len(sessions) >= 2 * writers and len(sessions) % len(logs) == 0
    assert len({s.session_id for s in sessions}) == len(sessions)
    lengths = [len(s.events) for s in sessions]
    assert lengths == sorted(lengths, reverse=True)
    copies = len(sessions) // len(logs)
    assert sorted(lengths) == sorted(len(log) for log in logs for _ in range(copies))
