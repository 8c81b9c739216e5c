"""REPORT.md rendered from a small synthetic results document: the cold-hydrate ratio against the snapshot baseline."""

from __future__ import annotations

from typing import Any

from ckpt.bench.harness.report import render

MACHINE = {
    "cpu": "cpu",
    "cores": 2,
    "memory_gib": 4,
    "platform": "linux",
    "python": "3.11",
    "libzstd": "1.5",
    "data_dir_fs": "ext4",
    "versions": {"ckpt": "0"},
}
META = {
    "sessions": 1,
    "checkpoints": 10,
    "mean_state_bytes": 1000,
    "max_state_bytes": 2000,
    "mean_patch_bytes": 100,
    "ideal_bytes_per_checkpoint": 50,
    "description": "synthetic",
}


def _cold(system: str, workload: str, p50_us: float, p99_us: float) -> dict[str, Any]:
    return {
        "system": system,
        "workload": workload,
        "metric": "hydrate_latest_cold",
        "value": p50_us,
        "unit": "us",
        "p50_us": p50_us,
        "p99_us": p99_us,
    }


def _doc(systems: list[str], records: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    workloads = ["chat", "coding"]
    return {
        "machine": MACHINE,
        "started_unix": 0,
        "duration_seconds": 60,
        "config": {"systems": systems, "workloads": workloads, "quick": True, "mode": "merge", "cold_rounds": 3},
        "system_labels": {"ckpt-embedded": "ckpt embedded (MERGE)", "pbzstd-lmdb": "protobuf + zstd -3 snapshots"},
        "workloads": {w: META for w in workloads},
        "records": records,
        **extra,
    }


def _hydrate_section(report: str) -> str:
    return report.split("## Hydrate latency", 1)[1]


def _rows(report: str, first_cell: str) -> list[list[str]]:
    """The hydrate section's table rows whose first cell is first_cell."""
    return [
        [c.strip() for c in line.strip("|").split("|")]
        for line in _hydrate_section(report).splitlines()
        if line.startswith(f"| {first_cell} |")
    ]


def test_cold_ratio_rows_give_each_workload_its_ratios_targets_and_verdicts() -> None:
    records = [
        _cold("ckpt-embedded", "chat", 90, 200),
        _cold("pbzstd-lmdb", "chat", 100, 100),
        _cold("ckpt-embedded", "coding", 300, 120),
        _cold("pbzstd-lmdb", "coding", 100, 100),
    ]
    report = render(_doc(["ckpt-embedded", "pbzstd-lmdb"], records), plots={}, command="ckpt bench run")
    assert (
        "**Cold latest hydrate, ckpt embedded (MERGE) / protobuf + zstd -3 snapshots**"
        " (goal: p50 <= 1.0x and p99 <= 1.5x on every workload)" in report
    )
    assert _rows(report, "workload")[0] == ["workload", "p50 ratio", "target", "holds", "p99 ratio", "target", "holds"]
    # The summary table, at the top of the hydrate section, then one ratio row under each workload's table.
    assert _hydrate_section(report).index("| workload |") < _hydrate_section(report).index("**chat**")
    assert _rows(report, "chat") == [["chat", "0.90x", "<= 1.0x", "yes", "2.00x", "<= 1.5x", "no"]]
    assert _rows(report, "coding") == [["coding", "3.00x", "<= 1.0x", "no", "1.20x", "<= 1.5x", "yes"]]
    assert _rows(report, "ratio") == [
        ["ratio", "0.90x", "<= 1.0x", "yes", "2.00x", "<= 1.5x", "no"],
        ["ratio", "3.00x", "<= 1.0x", "no", "1.20x", "<= 1.5x", "yes"],
    ]


def test_cold_ratio_says_what_is_missing_instead_of_failing() -> None:
    # The baseline not chosen by --systems: every workload's cell says so.
    without = render(_doc(["ckpt-embedded"], [_cold("ckpt-embedded", "chat", 90, 200)]), plots={}, command="c")
    assert _rows(without, "chat")[0][1] == "missing: pbzstd-lmdb not in this run"
    # Both chosen but one workload lacks the baseline's record; a skipped workload gets its own row.
    records = [
        _cold("ckpt-embedded", "chat", 90, 200),
        _cold("pbzstd-lmdb", "chat", 100, 100),
        _cold("ckpt-embedded", "coding", 300, 120),
    ]
    doc = _doc(["ckpt-embedded", "pbzstd-lmdb"], records, skipped_workloads={"trajectories": "no corpus"})
    report = render(doc, plots={}, command="c")
    assert _rows(report, "coding")[0][1:4] == ["missing: no pbzstd-lmdb figure", "<= 1.0x", "-"]
    assert _rows(report, "trajectories")[0][1] == "missing: workload skipped (no corpus)"
    assert _rows(report, "chat")[0][1] == "0.90x"
