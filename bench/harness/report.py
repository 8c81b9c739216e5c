"""Results document -> REPORT.md (tables with medians and same-run ratios) beside the plots."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from .. import langgraph_table
from . import events_report

CKPT = "ckpt-embedded"
SNAPSHOTS = "pbzstd-lmdb"
#: The hydration goal: ckpt's cold latest read over the snapshot baseline's, as (percentile key, at most this ratio).
COLD_TARGETS = (("p50_us", 1.0), ("p99_us", 1.5))
PEERS = ("langgraph-sqlite", "json-sqlite")
METRIC_LABELS = {
    "disk_bytes_per_checkpoint": "disk bytes / checkpoint",
    "stored_bytes_per_checkpoint": "stored payload bytes / checkpoint",
    "write_throughput": "writes/s",
    "hydrate_latest_hot": "hot latest hydrate",
    "hydrate_latest_cold": "cold latest hydrate",
    "hydrate_old_cold": "cold old-version hydrate",
}


class Results:
    """Look-ups over the flat records."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.records: list[dict[str, Any]] = doc["records"]
        self.systems: list[str] = list(doc["config"]["systems"])
        self.workloads: list[str] = list(doc["config"]["workloads"])

    def record(self, system: str, workload: str, metric: str, *, agents: int | None = None) -> dict[str, Any] | None:
        for r in self.records:
            if (
                r["system"] == system
                and r["workload"] == workload
                and r["metric"] == metric
                and (agents is None or r.get("agents") == agents)
            ):
                return r
        return None

    def get(
        self, system: str, workload: str, metric: str, *, agents: int | None = None, key: str = "value"
    ) -> float | None:
        r = self.record(system, workload, metric, agents=agents)
        value = None if r is None else r.get(key)
        return None if value is None else float(value)

    def agents_levels(self, workload: str) -> list[int]:
        return sorted({r["agents"] for r in self.records if r["workload"] == workload and "agents" in r})


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if unit == "B":
        if value >= 1024 * 1024:
            return f"{value / 1024 / 1024:,.1f} MiB"
        if value >= 10 * 1024:
            return f"{value / 1024:,.1f} KiB"
        return f"{value:,.0f} B"
    if unit == "us":
        if value >= 10_000:
            return f"{value / 1000:,.1f} ms"
        return f"{value:,.0f} µs" if value >= 100 else f"{value:,.1f} µs"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:,.2f}"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "-"
    r = a / b
    return f"{r:.2f}x" if r < 10 else f"{r:.1f}x"


def _unit(metric_label: str) -> str:
    return "B" if "bytes" in metric_label else ("us" if "hydrate" in metric_label else "")


def _table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> list[str]:
    header = list(header)
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _labels(doc: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = dict(doc.get("system_labels", {}))
    return {s: labels.get(s, s) for s in doc["config"]["systems"]}


def headline(res: Results, workload: str, *, peers: Iterable[str] = PEERS) -> list[dict[str, Any]]:
    """The closing-note ratios: ckpt embedded against each peer on one workload."""
    top = max(res.agents_levels(workload) or [1])
    rows = []
    for peer in peers:
        if peer not in res.systems or CKPT not in res.systems:
            continue
        for label, metric, key, agents, better in (
            ("disk bytes / checkpoint", "disk_bytes_per_checkpoint", "value", None, "lower"),
            ("writes/s, 1 agent", "write_throughput", "value", 1, "higher"),
            (f"writes/s, {top} agents", "write_throughput", "value", top, "higher"),
            ("cold latest hydrate p99", "hydrate_latest_cold", "p99_us", None, "lower"),
            ("hot latest hydrate p99", "hydrate_latest_hot", "p99_us", None, "lower"),
        ):
            ours = res.get(CKPT, workload, metric, agents=agents, key=key)
            theirs = res.get(peer, workload, metric, agents=agents, key=key)
            rows.append({"peer": peer, "metric": label, "ckpt": ours, "peer_value": theirs, "better": better})
    return rows


def cold_ratio_cells(res: Results, workload: str) -> list[str]:
    """ckpt embedded's cold latest hydrate over the snapshot baseline's: per target, the ratio, the target, holds."""
    missing = [s for s in (CKPT, SNAPSHOTS) if s not in res.systems]
    if missing:
        return [f"missing: {', '.join(missing)} not in this run"] + ["-"] * (3 * len(COLD_TARGETS) - 1)
    cells: list[str] = []
    for key, at_most in COLD_TARGETS:
        ours = res.get(CKPT, workload, "hydrate_latest_cold", key=key)
        theirs = res.get(SNAPSHOTS, workload, "hydrate_latest_cold", key=key)
        target = f"<= {at_most:.1f}x"
        if ours is None or theirs is None or theirs == 0:
            absent = [s for s, v in ((CKPT, ours), (SNAPSHOTS, theirs)) if not v]
            cells += [f"missing: no {', '.join(absent)} figure", target, "-"]
        else:
            cells += [_ratio(ours, theirs), target, "yes" if ours / theirs <= at_most else "no"]
    return cells


def _cold_ratio_header(first: str) -> list[str]:
    return [first, *(c for key, _ in COLD_TARGETS for c in (f"{key[:3]} ratio", "target", "holds"))]


def _cold_ratio_section(res: Results, labels: dict[str, str], skipped: dict[str, str]) -> list[str]:
    title = f"{labels.get(CKPT, CKPT)} / {labels.get(SNAPSHOTS, SNAPSHOTS)}"
    goal = " and ".join(f"{key[:3]} <= {at_most:.1f}x" for key, at_most in COLD_TARGETS)
    out = [f"**Cold latest hydrate, {title}** (goal: {goal} on every workload)", ""]
    rows = [[w, *cold_ratio_cells(res, w)] for w in res.workloads]
    rows += [
        [w, f"missing: workload skipped ({why})", *["-"] * (3 * len(COLD_TARGETS) - 1)] for w, why in skipped.items()
    ]
    out += _table(_cold_ratio_header("workload"), rows)
    return [*out, ""]


def render(
    doc: dict[str, Any],
    *,
    plots: dict[str, str],
    command: str,
    events: dict[str, Any] | None = None,
    langgraph: dict[str, Any] | None = None,
) -> str:
    """REPORT.md; ``events`` and ``langgraph``: the events and LangGraph savers benchmarks' results
    (events.json, langgraph.json), each rendered as a section of its own."""
    res = Results(doc)
    labels = _labels(doc)
    m = doc["machine"]
    when = dt.datetime.fromtimestamp(doc["started_unix"], tz=dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    cfg = doc["config"]
    out: list[str] = ["# ckpt benchmark report", ""]
    out += [
        f"Generated by `{command}` on {when}; the run took {doc['duration_seconds'] / 60:.1f} minutes"
        f"{' (--quick: small sizes, for smoke only)' if cfg['quick'] else ''}.",
        "Every figure below was measured in that one run, on one machine, with the systems side by side:"
        " latencies are medians (p50) and 99th percentiles of every timed call; ratios compare figures of that run.",
        "",
        f"**Machine:** {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, {m['platform']}, Python {m['python']},"
        f" libzstd {m['libzstd']}, data directory on {m['data_dir_fs']}. A shared, noisy VM: compare ratios, not"
        " absolute figures, across runs.",
        "",
        "**Versions:** " + ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v) + ".",
        "",
        f"**Write mode:** ckpt writes {cfg['mode'].upper()} ("
        + ("the step's changed fields" if cfg["mode"] == "merge" else "the whole state")
        + ") naming the states' type, ckpt.v1.Checkpoint, as a client that registered its schema does (each write"
        " validated against it, each chain's first frame compacted); every other system is handed the whole state"
        " each step, as it requires.",
        "",
    ]
    for workload, why in doc.get("skipped_workloads", {}).items():
        out += [f"**Skipped:** the {workload} workload: {why}.", ""]
    # Headline.
    head_wl = "trajectories" if "trajectories" in res.workloads else res.workloads[0]
    rows = headline(res, head_wl)
    if rows:
        out += [f"## Headline: ckpt against LangGraph's SqliteSaver and JSON-in-SQLite ({head_wl} workload)", ""]
        out += _table(
            ["metric", labels.get(CKPT, CKPT), "peer", "peer's figure", "ckpt advantage"],
            (
                [
                    r["metric"],
                    _fmt(r["ckpt"], "B" if "bytes" in r["metric"] else ("us" if "hydrate" in r["metric"] else "")),
                    labels.get(r["peer"], r["peer"]),
                    _fmt(
                        r["peer_value"], "B" if "bytes" in r["metric"] else ("us" if "hydrate" in r["metric"] else "")
                    ),
                    _ratio(r["peer_value"], r["ckpt"])
                    if r["better"] == "lower"
                    else _ratio(r["ckpt"], r["peer_value"]),
                ]
                for r in rows
            ),
        )
        out += [
            "",
            "(ckpt advantage: how many times smaller, faster or more writes/s ckpt is; below 1x the peer wins.)",
            "",
        ]
    # Every peer on every workload.
    others = [s for s in res.systems if s != CKPT]
    if CKPT in res.systems and others:
        out += [f"## {labels[CKPT]} against every system, every workload", ""]
        rows_all = []
        for w in res.workloads:
            for peer in others:
                rows_all.append(
                    [w, labels[peer]]
                    + [
                        _ratio(r["peer_value"], r["ckpt"])
                        if r["better"] == "lower"
                        else _ratio(r["ckpt"], r["peer_value"])
                        for r in headline(res, w, peers=(peer,))
                    ]
                )
        top = max((max(res.agents_levels(w) or [1]) for w in res.workloads), default=1)
        out += _table(
            [
                "workload",
                "peer",
                "bytes (x smaller)",
                "writes/s x1",
                f"writes/s x{top}",
                "cold p99 (x faster)",
                "hot p99 (x faster)",
            ],
            rows_all,
        )
        out += [
            "",
            "Each cell: the peer's figure over ckpt's (bytes, latency) or ckpt's over the peer's (writes/s), both from"
            " this run; above 1x ckpt is ahead. The large workload runs one agent only, so its top-concurrency cell"
            " repeats x1.",
            "",
        ]
    # Systems and workloads.
    out += ["## Systems", ""]
    out += _table(["system", "what it is"], ([f"`{s}`", labels[s]] for s in res.systems))
    out += ["", "## Workloads", ""]
    out += _table(
        [
            "workload",
            "sessions",
            "checkpoints",
            "mean state",
            "max state",
            "mean patch",
            "ideal / checkpoint",
            "what it is",
        ],
        (
            [
                f"`{w}`",
                str(meta["sessions"]),
                str(meta["checkpoints"]),
                _fmt(meta["mean_state_bytes"], "B"),
                _fmt(meta["max_state_bytes"], "B"),
                _fmt(meta["mean_patch_bytes"], "B"),
                _fmt(meta["ideal_bytes_per_checkpoint"], "B"),
                meta["description"],
            ]
            for w, meta in doc["workloads"].items()
        ),
    )
    out += [
        "",
        "Ideal: zstd -3 of each step's patch alone, the floor a delta store approaches.",
        "",
    ]
    # Bytes.
    out += ["## Bytes per checkpoint", ""]
    if "bytes" in plots:
        out += [f"![bytes per checkpoint]({plots['bytes']})", ""]
    out += _table(
        ["workload", *[labels[s] for s in res.systems], "ckpt / ideal"],
        (
            [
                w,
                *[
                    _fmt(res.get(s, w, "disk_bytes_per_checkpoint"), "B")
                    + f" ({_fmt(res.get(s, w, 'disk_bytes'), 'B')})"
                    if res.get(s, w, "disk_bytes") is not None
                    else "-"
                    for s in res.systems
                ],
                _ratio(
                    res.get(CKPT, w, "stored_bytes_per_checkpoint"), doc["workloads"][w]["ideal_bytes_per_checkpoint"]
                ),
            ]
            for w in res.workloads
        ),
    )
    out += [
        "",
        "Disk bytes per checkpoint (and in total, in parentheses): the files under the system's data directory after"
        " the single-agent run, divided by the checkpoints written (file sizes, so they include each engine's free"
        " pages and, for SQLite in WAL mode, the WAL). ckpt / ideal uses the frames ckpt stores (frame headers"
        " included).",
        "",
    ]
    # Throughput.
    out += ["## Write throughput and latency", ""]
    if "throughput" in plots:
        out += [f"![throughput by concurrency]({plots['throughput']})", ""]
    for w in res.workloads:
        levels = res.agents_levels(w)
        out += [f"**{w}**", ""]
        header = ["system"]
        for a in levels:
            header += [f"writes/s x{a}", f"p50 x{a}", f"p99 x{a}"]
        header += ["CPU / checkpoint (x1)"]
        out += _table(
            header,
            (
                [
                    labels[s],
                    *[
                        cell
                        for a in levels
                        for cell in (
                            _fmt(res.get(s, w, "write_throughput", agents=a)),
                            _fmt(res.get(s, w, "write_latency", agents=a, key="p50_us"), "us"),
                            _fmt(res.get(s, w, "write_latency", agents=a, key="p99_us"), "us"),
                        )
                    ],
                    _fmt(res.get(s, w, "cpu_per_checkpoint", agents=1), "us"),
                ]
                for s in res.systems
            ),
        )
        out += [""]
    out += [
        "xN: N agent threads writing their own sessions at once; each write returns only once durable"
        " (ckpt: LMDB commit with fsync; SQLite: WAL with synchronous=FULL unless the system's defaults say"
        " otherwise, see Systems). CPU: this process's CPU time plus that of every sidecar process (gRPC and"
        " store), per checkpoint.",
        "",
    ]
    # Hydration.
    out += ["## Hydrate latency", ""]
    if "cdf" in plots:
        out += [f"![cold hydrate latency CDFs]({plots['cdf']})", ""]
    out += _cold_ratio_section(res, labels, doc.get("skipped_workloads", {}))
    for w in res.workloads:
        out += [f"**{w}**", ""]
        out += _table(
            ["system", "hot latest p50", "p99", "cold latest p50", "p99", "cold old version p50", "p99"],
            (
                [
                    labels[s],
                    *[
                        _fmt(res.get(s, w, metric, key=key), "us")
                        for metric in ("hydrate_latest_hot", "hydrate_latest_cold", "hydrate_old_cold")
                        for key in ("p50_us", "p99_us")
                    ],
                ]
                for s in res.systems
            ),
        )
        out += [""]
        out += _table(
            _cold_ratio_header("cold latest, ckpt embedded / pb+zstd snapshots in LMDB"),
            [["ratio", *cold_ratio_cells(res, w)]],
        )
        out += [""]
    out += [
        "Hot: the store still open after writing (ckpt serves its state cache). Cold: the store closed and reopened"
        f" ({cfg['cold_rounds']} rounds; for the sidecar, the process restarted), each session's latest read once per"
        " round, then one random older version; the OS page cache stays warm. In-memory systems have no cold read.",
        "",
    ]
    # Tuning.
    sweeps = doc.get("tuning") or []
    if sweeps:
        out += ["## Tuning: bytes per version against cold hydrate latency", ""]
        if "tuning" in plots:
            out += [f"![tuning curves]({plots['tuning']})", ""]
    for sweep in sweeps:
        size = f"{sweep['sessions']} sessions x {sweep['steps']} steps; " if "sessions" in sweep else ""
        out += [
            f"**{sweep['workload']}** ({size}MERGE; each row changes one knob of the default ChainPolicy, or"
            " compacts MERGE states: StoreConfig.merge_message_type)",
            "",
        ]
        out += _table(
            ["knob", "value", "bytes / version", "cold latest p50", "p99", "cold old p50", "write CPU / version"],
            (
                [
                    t["knob"],
                    f"**{tuning_label(t)} (default)**" if t["default"] else tuning_label(t),
                    _fmt(t["bytes_per_version"], "B"),
                    _fmt(t["cold_latest_p50_us"], "us"),
                    _fmt(t["cold_latest_p99_us"], "us"),
                    _fmt(t["cold_old_p50_us"], "us"),
                    _fmt(t["write_cpu_us_per_version"], "us"),
                ]
                for t in sweep["points"]
            ),
        )
        out += [""]
    if events is not None:
        out += events_report.section(events)
    if langgraph is not None:
        out += langgraph_table.table(langgraph)
    return "\n".join(out) + "\n"


def tuning_label(point: dict[str, Any]) -> str:
    """A tuning point's value as shown (results written before the merge_message_type point have no label)."""
    return str(point.get("label") or f"{point['value']:g}")
