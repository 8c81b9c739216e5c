"""The event log benchmark, run quick as a user runs it (`python -m ckpt.bench.events_bench --quick`), and its
section of REPORT.md (`ckpt bench report`); its workload and its read check on their own.

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

from ckpt.bench import events_bench, trajectories
from ckpt.bench.events_echo import EchoAppender, append_requests
from ckpt.bench.events_replay import Event, SessionLog, corpus_logs, event_of, many_writer_sessions
from ckpt.bench.events_systems import SqliteEvents
from ckpt.bench.harness import events_report
from ckpt.sidecar.client import event
from ckpt.sidecar.client.events import append_events_request
from ckpt.v1 import service_pb2

ROOT = Path(__file__).resolve().parents[2]
SYSTEMS = {"ckpt-sidecar", "ckpt-embedded", "sqlite"}
PHASE_KEYS = ("appends_per_s", "append_p50_us", "append_p99_us", "disk_bytes", "bytes_per_event")
ECHO_KEYS = ("echo_calls_per_s_x1", "echo_calls_per_s_many", "echo_cold_p50_us", "echo_cold_p99_us")


@pytest.fixture(scope="module")
def quick_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("events-quick")
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt.bench.events_bench", "--quick", "--out", str(out), "--data-dir", str(out / "s")],
        cwd=ROOT,
        # A value `ckpt serve` refuses: the run passes only if the sidecar measured runs on its defaults.
        env={**os.environ, "CKPT_DURABILITY": "fast"},
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


def test_quick_run_sets_one_calls_ceiling_beside_the_goals_a_call_per_event_bounds(quick_out: Path) -> None:
    doc = _doc(quick_out)
    sidecar = doc["systems"]["ckpt-sidecar"]["median"]
    assert all(sidecar[key] > 0 for key in ECHO_KEYS)
    assert sidecar["echo_cold_p50_us"] <= sidecar["echo_cold_p99_us"]
    for name in ("ckpt-embedded", "sqlite"):  # in process: no call, no ceiling
        assert not any(key.startswith("echo") for key in doc["systems"][name]["median"]), name
    peer = doc["systems"]["sqlite"]["median"]
    goals = {g["metric"]: g for g in doc["goals"]}
    assert "ceiling" not in goals["bytes_per_event_many"]
    appends, cold = goals["appends_per_s_many"], goals["cold_p50_us"]
    assert appends["needed"] == pytest.approx(2 * peer["appends_per_s_many"])
    assert appends["needed_of"] == "2x SQLite's appends/s"
    assert appends["ceiling"] == sidecar["echo_calls_per_s_many"]
    assert appends["ceiling_of"] == "echo calls/s at 8 writers"
    assert appends["reachable_through_one_call"] == (appends["ceiling"] >= appends["needed"])
    assert cold["needed"] == pytest.approx(peer["cold_p50_us"]) and cold["needed_of"] == "SQLite's cold p50"
    assert cold["ceiling"] == sidecar["echo_cold_p50_us"] and cold["ceiling_of"] == "echo p50 of the same bytes"
    assert cold["reachable_through_one_call"] == (cold["ceiling"] <= cold["needed"])
    printed = (quick_out / "stdout.txt").read_text().splitlines()
    (ceiling_line,) = [line for line in printed if "one-call ceiling" in line]
    assert f"{sidecar['echo_calls_per_s_many']:,.0f} calls/s x8" in ceiling_line
    for metric, goal in (("appends_per_s_many", appends), ("cold_p50_us", cold)):
        (line,) = [line for line in printed if line.startswith(f"goal {metric}:")]
        reachable = "yes" if goal["reachable_through_one_call"] else "no"
        assert f"({goal['ceiling_of']}): reachable through one call: {reachable}" in line


def test_an_echo_appender_sends_the_append_request_the_client_would_and_checks_its_echo() -> None:
    log = SessionLog("s-1", (Event("user", b'{"n":1}', {}), Event("tool_call", b"{}", {"tool": "grep"})))
    requests = append_requests([log])
    assert set(requests) == {("s-1", 1), ("s-1", 2)}
    for (session_id, seq), sent in requests.items():
        item = log.events[seq - 1]
        got = service_pb2.AppendEventsRequest.FromString(sent)
        assert got.session_id == session_id and got.request_id and not got.HasField("put")
        assert [(e.type, e.payload, dict(e.attributes)) for e in got.events] == [
            (item.type, item.payload, item.attributes)
        ]
        # Another request id the client generates is as long: the same bytes on the wire.
        again = event(item.type, item.payload, attributes=item.attributes)
        assert len(append_events_request(session_id, [again], None, None).SerializeToString()) == len(sent)
    echoed: list[bytes] = []

    def echo(request: bytes) -> bytes:
        echoed.append(request)
        return request

    EchoAppender(echo, requests).append("s-1", 2, log.events[1])
    assert echoed == [requests[("s-1", 2)]]
    with pytest.raises(AssertionError, match="echo of s-1 seq 1's AppendEventsRequest came back changed"):
        EchoAppender(lambda b: b[:-1], requests).append("s-1", 1, log.events[0])


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
    figures, ceilings = _tables(lines)
    header, rule, *rows = figures
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

    header, rule, *rows = ceilings
    assert header == ["goal", "needs", "one call's ceiling", "reachable through one call", "holds"]
    sidecar = doc["systems"]["ckpt-sidecar"]["median"]
    appends, cold = goals["appends_per_s_many"], goals["cold_p50_us"]
    assert rows == [
        [
            "appends/s x8 >= 2x",
            f"{appends['needed']:,.0f} (2x SQLite's appends/s)",
            f"{sidecar['echo_calls_per_s_many']:,.0f} (echo calls/s at 8 writers)",
            "yes" if appends["reachable_through_one_call"] else "no",
            "yes" if appends["holds"] else "no",
        ],
        [
            "cold read of the last 50, p50 <= 1x",
            f"{events_report._us(cold['needed'])} (SQLite's cold p50)",
            f"{events_report._us(sidecar['echo_cold_p50_us'])} (echo p50 of the same bytes)",
            "yes" if cold["reachable_through_one_call"] else "no",
            "yes" if cold["holds"] else "no",
        ],
    ]
    assert any(line.startswith("One call's ceiling:") for line in lines)
    assert any(f"p99 {events_report._us(sidecar['echo_cold_p99_us'])}" in line for line in lines)


def _tables(lines: list[str]) -> list[list[list[str]]]:
    """Each markdown table of ``lines``: its rows' cells."""
    tables: list[list[list[str]]] = []
    previous = ""
    for line in lines:
        if line.startswith("|"):
            if not previous.startswith("|"):
                tables.append([])
            tables[-1].append([c.strip() for c in line.strip("|").split("|")])
        previous = line
    return tables


def test_a_results_file_from_before_the_echo_figures_renders_without_ceilings(quick_out: Path) -> None:
    doc = _doc(quick_out)
    for system in doc["systems"].values():
        system["median"] = {k: v for k, v in system["median"].items() if not k.startswith("echo")}
    for goal in doc["goals"]:
        for key in ("needed", "needed_of", "ceiling_metric", "ceiling", "ceiling_of", "reachable_through_one_call"):
            goal.pop(key, None)
    lines = events_report.section(doc)
    assert len(_tables(lines)) == 1
    assert not any("ceiling" in line for line in lines)


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
