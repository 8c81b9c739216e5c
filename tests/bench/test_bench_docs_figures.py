"""The figures README.md and docs/performance.md quote from the committed report are that report's.

The headline tables' ratios and the tuning table's bytes and cold p50s are recomputed from
bench/results.json (the run bench/REPORT.md was rendered from): a new committed run whose figures
differ fails here until the docs quote it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from ckpt.bench.harness import report

ROOT = Path(__file__).resolve().parents[2]
RESULTS = json.loads((ROOT / "bench" / "results.json").read_text())
REPORT = (ROOT / "bench" / "REPORT.md").read_text()
HEADLINE_PEERS = {"LangGraph SqliteSaver": "langgraph-sqlite", "JSON in SQLite": "json-sqlite"}
DOCS = ["README.md", "docs/performance.md"]


def _ratio(value: float) -> str:
    """As the report prints a ratio."""
    return f"{value:.2f}x" if value < 10 else f"{value:.1f}x"


def _table_after(text: str, header_start: str) -> list[list[str]]:
    """The rows (cells stripped) of the one table whose header line starts with ``header_start``."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(header_start)]
    assert len(starts) == 1, f"expected one table headed {header_start!r}, found {len(starts)}"
    rows = []
    for line in lines[starts[0] :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return [rows[0], *rows[2:]]  # the header, then the body (the |---| line dropped)


def _headline_ratios() -> dict[tuple[str, str], str]:
    """(peer, metric label) -> the report's "ckpt advantage" cell, from results.json."""
    res = report.Results(RESULTS)
    out = {}
    for row in report.headline(res, "trajectories"):
        ours, theirs = row["ckpt"], row["peer_value"]
        out[(row["peer"], row["metric"])] = _ratio(theirs / ours if row["better"] == "lower" else ours / theirs)
    return out


@pytest.mark.parametrize("doc", DOCS)
def test_the_headline_table_quotes_the_committed_run(doc: str) -> None:
    header, *body = _table_after((ROOT / doc).read_text(), "| ckpt against | bytes per checkpoint |")
    metrics = {
        "bytes per checkpoint": "disk bytes / checkpoint",
        "writes/s, 1 agent": "writes/s, 1 agent",
        "writes/s, 64 agents": "writes/s, 64 agents",
        "cold latest p99": "cold latest hydrate p99",
        "hot latest p99": "hot latest hydrate p99",
    }
    assert header[1:] == list(metrics)
    expected = _headline_ratios()
    assert sorted(row[0] for row in body) == sorted(HEADLINE_PEERS)
    for label, *cells in body:
        peer = HEADLINE_PEERS[label]
        for column, cell in zip(metrics.values(), cells, strict=True):
            quoted = re.match(r"[\d.]+x", cell)
            assert quoted, f"{doc}: {label} / {column}: no ratio in {cell!r}"
            want = expected[(peer, column)]
            assert quoted.group() == want, f"{doc}: {label} / {column} quotes {cell!r}; the committed run: {want}"
            # Below 1x ckpt trails: the cell must not call it ahead.
            ahead = float(want[:-1]) >= 1
            assert ahead or not re.search(r"faster|smaller", cell), f"{doc}: {label} / {column}: {cell!r}"
            # And the committed REPORT.md shows the same cell.
            assert re.search(rf"^\| {re.escape(column)} \|.*\| {re.escape(want)} \|$", REPORT, re.M), (peer, column)


def _tuning_points(workload: str) -> list[dict[str, Any]]:
    (sweep,) = [t for t in RESULTS["tuning"] if t["workload"] == workload]
    return list(sweep["points"])


def _expected_tuning_cell(workload: str, turn: str) -> tuple[str, str]:
    """The (bytes, cold p50) a tuning row quotes for ``workload``: the default's p50 as its min-max."""
    points = _tuning_points(workload)
    if not turn:
        defaults = [p for p in points if p["default"]]
        low, high = (round(f(p["cold_latest_p50_us"] for p in defaults)) for f in (min, max))
        return f"{round(defaults[0]['bytes_per_version']):,} B", f"{low}-{high} us"
    knob = re.match(r"`(\w+)`", turn)
    assert knob, turn
    (point,) = [
        p
        for p in points
        if p["knob"] == knob.group(1)
        and (p["knob"] == "merge_message_type" or float(turn.split()[-1]) == float(p["value"]))
    ]
    return f"{round(point['bytes_per_version']):,} B", f"{round(point['cold_latest_p50_us'])} us"


def test_the_tuning_table_quotes_the_committed_run() -> None:
    _header, *body = _table_after((ROOT / "docs" / "performance.md").read_text(), "| goal | turn | trajectories")
    assert len(body) >= 5
    for _goal, turn, *cells in body:
        for workload, cell in zip(("trajectories", "factual"), cells, strict=True):
            size, p50 = _expected_tuning_cell(workload, turn)
            quoted = re.search(r"([\d,]+) B(?:/version)?, ([\d-]+ us)", cell)
            assert quoted, f"tuning {turn or 'default'} / {workload}: no figures in {cell!r}"
            assert (f"{quoted.group(1)} B", quoted.group(2)) == (size, p50), (turn, workload, cell)
