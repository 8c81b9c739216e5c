"""The event log against an SQLite events table: bytes per event, appends/s, cold reads of the last 50.

    python -m ckpt.bench.events_bench [--rounds R] [--writers 64] [--out DIR] [--quick]

The shared trajectories (bench/trajectories.py) are replayed as agents' event
logs, one event per message (bench/events_replay.py), through ckpt's sidecar,
ckpt embedded and an SQLite events table (bench/events_systems.py), side by
side, the systems' order reversed every other round. Each round, each system:

1. one writer appends the corpus, one session per trajectory, one event per call, each durable before
   the next: appends/s and each append's latency, x1; the bytes on disk after it, closed;
2. a fresh store; ``--writers`` threads append the corpus repeated until there are two sessions per
   writer (each copy under new session ids), taking whole sessions from one queue, longest first:
   appends/s x N, and the bytes on disk after it, closed (SQLite: after a ``wal_checkpoint(TRUNCATE)``);
3. a new reader on that store (the sidecar restarted, the store reopened, a new SQLite connection) reads
   the newest 50 events of every session once, in a shuffled order: p50/p99 over the sessions. Every read
   is checked against the events appended (seqs and payloads).

The sidecar's phases are each followed by the same phase made of echo calls on the same channel, each
carrying the bytes of the call it stands for (bench/events_echo.py): the most calls/s, and the quickest
reply, a client making one call per event can get here, beside the goals they bound.

Figures are medians over the rounds; the issue's goals, judged on ckpt's sidecar against SQLite from
those medians (bytes per event after the N-writer run, appends/s at N writers, cold p50), are printed
and written to DIR/events.json, which ``ckpt bench report --out DIR`` renders into REPORT.md. A missed
goal is a figure, not a failure: the exit status is 1 only if a read came back wrong.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import queue
import random
import shlex
import shutil
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from . import trajectories
from .events_echo import EchoAppender, append_requests, warm_up
from .events_replay import SessionLog, corpus_logs, describe, many_writer_sessions, single_writer_sessions
from .events_systems import SYSTEMS, Appender, EchoCall, EventSystem
from .stats import medians, percentile
from .store_bench.common import data_root

#: The results file, in --out; ``ckpt bench report`` renders it (bench/harness/events_report.py).
EVENTS_JSON = "events.json"
READ_LAST = 50
CKPT, PEER = "ckpt-sidecar", "sqlite"
#: The issue's goals: (metric, what the ratio is, comparison, bound); each ratio is ckpt's sidecar's
#: advantage, computed from the medians over the rounds.
GOALS: tuple[tuple[str, str, str, float], ...] = (
    ("bytes_per_event_many", "SQLite's / ckpt's", ">=", 3.0),
    ("appends_per_s_many", "ckpt's / SQLite's", ">=", 2.0),
    ("cold_p50_us", "ckpt's / SQLite's", "<=", 1.0),
)
#: The goals one call per event bounds: (the sidecar's echo figure that bounds it, what the goal asks of,
#: what the echo figure is). The goal is within reach of a one-call-per-event client only if its echo is.
CEILINGS: dict[str, tuple[str, str, str]] = {
    "appends_per_s_many": ("echo_calls_per_s_many", "SQLite's appends/s", "echo calls/s at {writers} writers"),
    "cold_p50_us": ("echo_cold_p50_us", "SQLite's cold p50", "echo p50 of the same bytes"),
}
Item = TypeVar("Item")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ckpt.bench.events_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--rounds", type=int, help="rounds, each system once per round (default 3; --quick: 1)")
    p.add_argument("--writers", type=int, help="writer threads of the concurrent run (default 64; --quick: 8)")
    p.add_argument("--out", type=Path, default=Path("."), help=f"directory for {EVENTS_JSON} (default: .)")
    p.add_argument("--quick", action="store_true", help="a few short sessions, one round: a smoke run")
    p.add_argument("--trajectories", type=Path, help="trajectory corpus (default $CKPT_TRAJECTORIES or ../shared)")
    p.add_argument("--data-dir", type=Path, help="scratch directory (default $CKPT_BENCH_DIR, else .bench-data)")
    return p


def run_writers(appender: Callable[[], Appender], sessions: list[SessionLog], writers: int) -> dict[str, float]:
    """``writers`` threads, each with its own ``appender()``, append every session's events, taking sessions
    from one queue; appends/s over the whole run (the first append to the last one's return) and each
    append's latency."""
    jobs: queue.SimpleQueue[SessionLog] = queue.SimpleQueue()
    for s in sessions:
        jobs.put(s)
    start = threading.Barrier(writers + 1)
    latencies: list[list[int]] = [[] for _ in range(writers)]
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            handle = appender()
        except BaseException as exc:
            errors.append(exc)
            start.abort()
            return
        mine = latencies[i]
        try:
            start.wait()
            while True:
                try:
                    log = jobs.get_nowait()
                except queue.Empty:
                    return
                for seq, item in enumerate(log.events, start=1):
                    t0 = time.perf_counter_ns()
                    handle.append(log.session_id, seq, item)
                    mine.append(time.perf_counter_ns() - t0)
        except threading.BrokenBarrierError:
            return
        except BaseException as exc:
            errors.append(exc)
        finally:
            handle.close()

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(writers)]
    for t in threads:
        t.start()
    gc.collect()
    with contextlib.suppress(threading.BrokenBarrierError):
        start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    if errors:
        raise errors[0]
    flat = [ns for lat in latencies for ns in lat]
    return {
        "events": len(flat),
        "seconds": seconds,
        "appends_per_s": len(flat) / seconds,
        "append_p50_us": percentile(flat, 50) / 1e3,
        "append_p99_us": percentile(flat, 99) / 1e3,
    }


def read_order(sessions: list[SessionLog], seed: int) -> list[SessionLog]:
    """The sessions in the order the cold reads take them."""
    order = list(sessions)
    random.Random(seed).shuffle(order)
    return order


def time_each(items: Sequence[Item], call: Callable[[Item], Any], check: Callable[[Item, Any], None]) -> list[int]:
    """Each item's ``call`` timed alone (ns), the garbage collector off so that no collection lands in one;
    each result then checked, untimed."""
    took: list[int] = []
    gc.collect()
    gc.disable()
    try:
        for item in items:
            t0 = time.perf_counter_ns()
            got = call(item)
            took.append(time.perf_counter_ns() - t0)
            check(item, got)
    finally:
        gc.enable()
    return took


def p50_p99(took: list[int], prefix: str) -> dict[str, float]:
    return {f"{prefix}_p50_us": percentile(took, 50) / 1e3, f"{prefix}_p99_us": percentile(took, 99) / 1e3}


def cold_reads(system: EventSystem, sessions: list[SessionLog], seed: int) -> dict[str, float]:
    """The newest READ_LAST events of each session once, shuffled, by a new reader; each read checked."""
    order = read_order(sessions, seed)
    system.reopen()
    took = time_each(
        order, lambda log: system.read_last(log.session_id, READ_LAST), lambda log, got: check_read(system, log, got)
    )
    return p50_p99(took, "cold")


def echo_writers(echo: EchoCall, sessions: list[SessionLog], writers: int) -> float:
    """Calls/s of :func:`run_writers` with each append replaced by an echo of its AppendEventsRequest."""
    requests = append_requests(sessions)
    return run_writers(lambda: EchoAppender(echo, requests), sessions, writers)["appends_per_s"]


def echo_cold_reads(system: EventSystem, echo: EchoCall, sessions: list[SessionLog], seed: int) -> dict[str, float]:
    """After :func:`cold_reads` (its reader still open): each session's newest-READ_LAST reply read again
    (untimed), then one echo of those bytes a session, in the cold reads' order; p50/p99."""
    replies = [system.read_reply(log.session_id, READ_LAST) for log in read_order(sessions, seed)]
    warm_up(echo, len(replies[0]))

    def same_bytes(reply: bytes, got: bytes) -> None:
        if got != reply:
            raise AssertionError("the echo of a ReadEvents reply came back changed")

    return p50_p99(time_each(replies, echo, same_bytes), "echo_cold")


def check_read(system: EventSystem, log: SessionLog, got: Sequence[Any]) -> None:
    n = len(log.events)
    want = [(seq, log.events[seq - 1].payload) for seq in range(n, max(n - READ_LAST, 0), -1)]
    have = [system.seq_and_payload(item) for item in got]
    if have != want:
        seqs = [seq for seq, _ in have]
        raise AssertionError(
            f"{system.name}: the newest {READ_LAST} events of {log.session_id} came back wrong (seqs {seqs[:5]}..."
            f" of {len(seqs)}; {n} appended)"
        )


def one_round(
    system: EventSystem, single: list[SessionLog], many: list[SessionLog], writers: int, scratch: Path, seed: int
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for phase, sessions, threads in (("x1", single, 1), ("many", many, writers)):
        directory = scratch / f"{system.name}-{phase}"
        shutil.rmtree(directory, ignore_errors=True)
        system.open(directory)
        try:
            load = run_writers(system.appender, sessions, threads)
            echo = system.echo()
            if echo is not None:
                out[f"echo_calls_per_s_{phase}"] = echo_writers(echo, sessions, threads)
            system.close()
            disk = system.disk()
            for key in ("appends_per_s", "append_p50_us", "append_p99_us"):
                out[f"{key}_{phase}"] = load[key]
            out[f"disk_bytes_{phase}"] = disk.pop("disk_bytes")
            out[f"bytes_per_event_{phase}"] = out[f"disk_bytes_{phase}"] / load["events"]
            out[f"disk_{phase}"] = disk
            if phase == "many":
                out.update(cold_reads(system, sessions, seed))
                echo = system.echo()
                if echo is not None:
                    out.update(echo_cold_reads(system, echo, sessions, seed))
        finally:
            system.shutdown()
        shutil.rmtree(directory, ignore_errors=True)
    return out


def goals(figures: dict[str, dict[str, float]], writers: int) -> list[dict[str, Any]]:
    out = []
    for metric, ratio_of, comparison, bound in GOALS:
        ours, theirs = figures[CKPT][metric], figures[PEER][metric]
        ratio = theirs / ours if ratio_of.startswith("SQLite") else ours / theirs
        holds = ratio >= bound if comparison == ">=" else ratio <= bound
        goal = {
            "metric": metric,
            "ckpt": ours,
            "sqlite": theirs,
            "ratio": ratio,
            "ratio_of": ratio_of,
            "target": f"{comparison} {bound:g}",
            "holds": holds,
        }
        if metric in CEILINGS and CEILINGS[metric][0] in figures[CKPT]:
            echo_metric, needed_of, ceiling_of = CEILINGS[metric]
            # Both bounded goals are ckpt's figure over SQLite's: the figure the goal asks of ckpt is bound x SQLite's.
            needed, ceiling = bound * theirs, figures[CKPT][echo_metric]
            goal |= {
                "needed": needed,
                "needed_of": needed_of if bound == 1 else f"{bound:g}x {needed_of}",
                "ceiling_metric": echo_metric,
                "ceiling": ceiling,
                "ceiling_of": ceiling_of.format(writers=writers),
                "reachable_through_one_call": ceiling >= needed if comparison == ">=" else ceiling <= needed,
            }
        out.append(goal)
    return out


def run(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    quick = args.quick
    rounds = args.rounds or (1 if quick else 3)
    writers = args.writers or (8 if quick else 64)
    if rounds < 1 or writers < 1:
        raise ValueError("--rounds and --writers must be at least 1")
    logs = corpus_logs(trajectories.load(args.trajectories), quick=quick)
    single = single_writer_sessions(logs, "bench-events")
    many = many_writer_sessions(logs, writers, "bench-events")
    scratch = (args.data_dir or data_root()) / f"events-{os.getpid()}"
    systems = {name: cls() for name, cls in SYSTEMS.items()}
    per_round: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
    started = time.time()
    try:
        for r in range(rounds):
            order = list(systems) if r % 2 == 0 else list(reversed(systems))
            for name in order:
                print(f"round {r + 1}/{rounds}: {name}", file=sys.stderr, flush=True)
                per_round[name].append(one_round(systems[name], single, many, writers, scratch, seed=r))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    figures = {name: medians(rs) for name, rs in per_round.items()}
    return {
        "command": "python -m ckpt.bench.events_bench " + " ".join(shlex.quote(a) for a in argv),
        "started_unix": started,
        "duration_seconds": time.time() - started,
        "config": {
            "quick": quick,
            "rounds": rounds,
            "writers": writers,
            "read_last": READ_LAST,
            "sessions_x1": len(single),
            "events_x1": sum(len(s.events) for s in single),
            "sessions_many": len(many),
            "events_many": sum(len(s.events) for s in many),
            "many_sessions": "the corpus repeated, each copy under new session ids, taken longest first from"
            " one queue by the writers",
        },
        "machine": machine(),
        "workload": describe(logs),
        "systems": {
            name: {"label": s.label, "settings": s.settings(), "median": figures[name], "rounds": per_round[name]}
            for name, s in systems.items()
        },
        "goals": goals(figures, writers),
    }


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        cpu = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), cpu)
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
    }


def render_text(doc: dict[str, Any]) -> str:
    cfg, work = doc["config"], doc["workload"]
    w = cfg["writers"]
    lines = [
        f"{work['trajectories']} trajectories, {cfg['events_x1']} events x1 ({work['payload_bytes_per_event']:,.0f}"
        f" payload bytes per event); {cfg['writers']} writers: {cfg['sessions_many']} sessions, {cfg['events_many']}"
        f" events; medians of {cfg['rounds']} round(s)",
        f"{'system':15} {'B/event x1':>11} {f'B/event x{w}':>12} {'appends/s x1':>13} {f'appends/s x{w}':>14}"
        f" {'cold p50':>10} {'cold p99':>10}",
    ]
    for name, s in doc["systems"].items():
        m = s["median"]
        lines.append(
            f"{name:15} {m['bytes_per_event_x1']:11,.0f} {m['bytes_per_event_many']:12,.0f}"
            f" {m['appends_per_s_x1']:13,.0f} {m['appends_per_s_many']:14,.0f}"
            f" {m['cold_p50_us']:8,.0f}us {m['cold_p99_us']:8,.0f}us"
        )
    echo = doc["systems"].get(CKPT, {}).get("median", {})
    if "echo_calls_per_s_many" in echo:
        lines.append(
            f"{CKPT}'s one-call ceiling (echo of the same bytes, same channel): {echo['echo_calls_per_s_x1']:,.0f}"
            f" calls/s x1, {echo['echo_calls_per_s_many']:,.0f} calls/s x{w}; a cold read's reply"
            f" {echo['echo_cold_p50_us']:,.0f}us p50, {echo['echo_cold_p99_us']:,.0f}us p99"
        )
    for g in doc["goals"]:
        line = (
            f"goal {g['metric']}: {g['ratio_of']} = {g['ratio']:.2f} (target {g['target']}):"
            f" {'holds' if g['holds'] else 'MISSED'}"
        )
        if "ceiling" in g:
            unit = "us" if g["metric"].endswith("_us") else "/s"
            reachable = "yes" if g["reachable_through_one_call"] else "no"
            line += (
                f"; needs {g['needed']:,.0f}{unit} ({g['needed_of']}), one call's ceiling {g['ceiling']:,.0f}{unit}"
                f" ({g['ceiling_of']}): reachable through one call: {reachable}"
            )
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(arguments)
    try:
        doc = run(args, arguments)
    except (ValueError, FileNotFoundError) as exc:
        print(f"events_bench: {exc}", file=sys.stderr)
        return 2
    print(render_text(doc))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / EVENTS_JSON).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out / EVENTS_JSON}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
