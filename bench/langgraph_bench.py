"""LangGraph savers side by side: ckpt (sidecar and embedded) against SqliteSaver, LMDBSaver and PostgresSaver.

    python -m ckpt.bench.langgraph_bench [--threads 64] [--steps 200] [--rounds 3] [--out DIR] [--smoke]

A real LangGraph ``StateGraph`` (an agent appending messages and tool results from the shared
trajectories, bench/langgraph_replay.py) runs once per thread with a recording saver; its calls are then
replayed, the same objects in the same order, against every saver (bench/langgraph_systems.py), so that
the graph engine's own time does not blur the savers'. Each round, each saver (the order reversed every
other round):

1. x1: a fresh store; one writer replays ``--x1-threads`` threads one after the other;
2. xN: a fresh store; ``--threads`` writer threads at once, each replaying its own thread;
   then the history (``saver.list``, what ``get_state_history`` reads) of ``--history-threads`` threads,
   whole, each checked; then the store closed durably and its bytes measured.

Every ``put``, ``put_writes`` and ``get_tuple`` is timed on its own (``time.perf_counter_ns``); after each
put, the thread's latest checkpoint is read back (``get_tuple`` without an id: what a process resuming the
thread reads) and checked to be the one just put. The recording's objects are frozen out of Python's
garbage collector (``gc.freeze``) while the savers run: otherwise each full collection traverses them all,
seconds that land in whichever saver's put triggered it. Figures are medians over the rounds; the goals'
ratios are computed from them, printed with a markdown table and written to DIR/langgraph.json, which
``ckpt bench report --out DIR`` renders into REPORT.md. A missed goal is a figure, not a failure: the exit
status is 1 only if a read came back wrong, 2 if the benchmark cannot run (no corpus, no PostgreSQL).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import shlex
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from . import langgraph_floors, langgraph_split, postgres_server, trajectories
from .langgraph_replay import Put, ThreadRecord, record
from .langgraph_systems import (
    NAMES,
    CkptEmbeddedSystem,
    CkptSidecarSystem,
    LmdbSystem,
    PostgresSystem,
    SaverSystem,
    SqliteSystem,
)
from .langgraph_table import LANGGRAPH_JSON, table
from .output import tree_cpu_seconds
from .stats import medians, percentile
from .store_bench.common import data_root

OPS = ("put", "put_writes", "get_tuple")
PEERS = ("sqlite", "lmdb", "postgres")
#: The issue's goals. Bytes: each ckpt saver's against every peer's, the peer's over ckpt's, >= 20.
#: Latency: (ckpt saver, peer): ckpt's p50 over the peer's, <= 1.0, for put and get_tuple at x1 and xN.
BYTES_TARGET = 20.0
LATENCY_PAIRS = (("ckpt-sidecar", "postgres"), ("ckpt-embedded", "sqlite"))
LATENCY_TARGET = 1.0
SMOKE = {"threads": 4, "steps": 12, "rounds": 1, "x1_threads": 1, "history_threads": 2}
DEFAULTS = {"threads": 64, "steps": 200, "rounds": 3, "x1_threads": 4, "history_threads": 8}


def parser(prog: str = "python -m ckpt.bench.langgraph_bench") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--threads", type=int, help="writer threads of the concurrent run, one LangGraph thread each (64)")
    p.add_argument("--steps", type=int, help="checkpoints per thread (200)")
    p.add_argument("--rounds", type=int, help="rounds, each saver once per round; figures are medians (3)")
    p.add_argument("--x1-threads", type=int, help="threads the single writer replays one after another (4)")
    p.add_argument("--history-threads", type=int, help="threads whose whole history is listed and timed (8)")
    p.add_argument("--systems", nargs="+", choices=NAMES, metavar="S", help=f"savers (default all: {' '.join(NAMES)})")
    p.add_argument("--smoke", action="store_true", help=f"tiny sizes ({SMOKE}), for a quick check, not figures")
    p.add_argument("--out", type=Path, default=Path("."), help=f"directory for {LANGGRAPH_JSON} (default: .)")
    p.add_argument("--trajectories", type=Path, help="trajectory corpus (default $CKPT_TRAJECTORIES or ../shared)")
    p.add_argument("--data-dir", type=Path, help="scratch directory (default $CKPT_BENCH_DIR, else .bench-data)")
    return p


def replay(saver: Any, rec: ThreadRecord, took: dict[str, list[int]]) -> None:
    """``rec``'s calls against ``saver``, each timed into ``took``; after each put, the latest read back."""
    clock = time.perf_counter_ns
    for call in rec.calls:
        if isinstance(call, Put):
            t0 = clock()
            saver.put(call.config, call.checkpoint, call.metadata, call.new_versions)
            t1 = clock()
            got = saver.get_tuple(rec.latest_config)
            t2 = clock()
            took["put"].append(t1 - t0)
            took["get_tuple"].append(t2 - t1)
            have = None if got is None else got.config["configurable"].get("checkpoint_id")
            if have != call.checkpoint["id"]:
                raise AssertionError(
                    f"{rec.thread_id}: the latest checkpoint read back is {have}, not the one just put"
                )
        else:
            t0 = clock()
            saver.put_writes(call.config, call.writes, call.task_id, call.task_path)
            took["put_writes"].append(clock() - t0)


def run_writers(system: SaverSystem, jobs: list[list[ThreadRecord]]) -> dict[str, Any]:
    """One writer thread per job, each replaying its threads in order, started together; every call's latency."""
    start = threading.Barrier(len(jobs) + 1)
    took: list[dict[str, list[int]]] = [{op: [] for op in OPS} for _ in jobs]
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            saver = system.saver()
        except BaseException as exc:
            errors.append(exc)
            start.abort()
            return
        try:
            start.wait()
            for rec in jobs[i]:
                replay(saver, rec, took[i])
        except threading.BrokenBarrierError:
            return
        except BaseException as exc:
            errors.append(exc)
        finally:
            system.release(saver)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(len(jobs))]
    for t in threads:
        t.start()
    gc.collect()
    pid = system.server_pid()
    # Read while the writers wait at the barrier: once they run, this thread waits for the interpreter lock
    # at each of the reads' files (seconds over a server's processes), and a short run could end first.
    server0 = tree_cpu_seconds(pid) if pid is not None else 0.0
    with contextlib.suppress(threading.BrokenBarrierError):
        start.wait()
    t0, cpu0 = time.perf_counter(), time.process_time()
    for t in threads:
        t.join()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    server = None
    if pid is not None:
        system.settle()
        server = tree_cpu_seconds(pid) - server0
    if errors:
        raise errors[0]
    puts = sum(len(mine["put"]) for mine in took)
    # Every thread of this process (the savers' calls, their serializer, an embedded store's writer) and,
    # for a saver with a server, the server's processes: what a step costs the machine's cores.
    out: dict[str, Any] = {"seconds": seconds, "process_cpu_us_per_put": cpu / puts * 1e6}
    if server is not None:
        out["server_cpu_us_per_put"] = server / puts * 1e6
    for op in OPS:
        flat = [ns for mine in took for ns in mine[op]]
        out[f"{op}_calls"] = len(flat)
        out[f"{op}_p50_us"] = percentile(flat, 50) / 1e3
        out[f"{op}_p99_us"] = percentile(flat, 99) / 1e3
    out["puts_per_s"] = out["put_calls"] / seconds
    return out


def histories(system: SaverSystem, records: list[ThreadRecord]) -> dict[str, float]:
    """Each thread's whole history listed newest first (``saver.list``), timed and checked; then its latest
    state checked against what the graph built."""
    saver = system.saver()
    took: list[int] = []
    try:
        for rec in records:
            t0 = time.perf_counter_ns()
            listed = list(saver.list(rec.latest_config))
            took.append(time.perf_counter_ns() - t0)
            want = [c.checkpoint["id"] for c in reversed(rec.calls) if isinstance(c, Put)]
            have = [t.config["configurable"]["checkpoint_id"] for t in listed]
            if have != want:
                raise AssertionError(f"{system.name}: {rec.thread_id}'s history came back wrong ({len(have)} listed)")
            last = saver.get_tuple(rec.latest_config)
            messages = last.checkpoint["channel_values"].get("messages", []) if last else []
            final = next(c for c in reversed(rec.calls) if isinstance(c, Put)).checkpoint["channel_values"]["messages"]
            if len(messages) != rec.messages or messages[-1].content != final[-1].content:
                raise AssertionError(f"{system.name}: {rec.thread_id}'s latest state came back wrong")
    finally:
        system.release(saver)
    return {"history_p50_ms": percentile(took, 50) / 1e6, "history_max_ms": max(took) / 1e6}


def one_round(
    system: SaverSystem, records: list[ThreadRecord], args: argparse.Namespace, scratch: Path
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    x1_jobs = [records[: args.x1_threads]]
    many_jobs = [[rec] for rec in records]
    for phase, jobs in (("x1", x1_jobs), ("many", many_jobs)):
        directory = scratch / f"{system.name}-{phase}"
        shutil.rmtree(directory, ignore_errors=True)
        system.open(directory)
        try:
            load = run_writers(system, jobs)
            out.update({f"{key}_{phase}": value for key, value in load.items()})
            if phase == "many":
                out.update(histories(system, records[: args.history_threads]))
            system.close()
            if phase == "many":
                footprint = system.footprint()
                checkpoints = sum(rec.puts for rec in records)
                out["footprint_bytes"] = footprint.pop("bytes")
                out["bytes_per_checkpoint"] = out["footprint_bytes"] / checkpoints
                out["footprint"] = footprint
        finally:
            system.shutdown()
        shutil.rmtree(directory, ignore_errors=True)
    return out


#: The put floors: (saver, its figures' prefix, the store it commits to, its durable commit's timer, its
#: serializer's figure): the serializer as that saver's put calls it, plus one durable commit of what it
#: stores (the floor, ``{prefix}_put_floor_us``); and its puts split into those parts and the rest
#: (``{prefix}_split_{part}_p50_us``, langgraph_split.py).
_PUT_FLOORS = (
    ("ckpt-embedded", "embedded", "lmdb", langgraph_floors.lmdb_commit_us, "serialize_changed_p50_us"),
    ("sqlite", "sqlite", "sqlite", langgraph_floors.sqlite_commit_us, "serialize_whole_p50_us"),
)


def floors(
    chosen: tuple[str, ...],
    x1_records: list[ThreadRecord],
    per_round: dict[str, list[dict[str, Any]]],
    server: postgres_server.PostgresServer | None,
    scratch: Path,
) -> dict[str, float]:
    """One round of langgraph_floors' figures: the embedded put's and SqliteSaver's put's (of those that ran)
    and their puts split into those parts (langgraph_split), the transports'."""
    out: dict[str, float] = {}
    commits = sum(rec.puts for rec in x1_records)
    for system, prefix, store, commit_us, serializer in _PUT_FLOORS:
        if system not in chosen:
            continue
        if serializer not in out:
            out.update(langgraph_floors.serializer_us(x1_records))
        value_bytes = int(per_round[system][-1]["bytes_per_checkpoint"])
        out[f"{store}_commit_p50_us"] = commit_us(scratch / f"floor-{store}", value_bytes, commits)
        out[f"{store}_commit_value_bytes"] = value_bytes
        out[f"{prefix}_put_floor_us"] = out[serializer] + out[f"{store}_commit_p50_us"]
        split = langgraph_split.put_split_us(system, scratch / f"split-{prefix}", x1_records)
        shutil.rmtree(scratch / f"split-{prefix}", ignore_errors=True)
        out.update({f"{prefix}_split_{key}": value for key, value in split.items()})
    if "ckpt-sidecar" in chosen:
        sidecar = CkptSidecarSystem()
        sidecar.open(scratch / "floor-sidecar")
        try:
            grpc = langgraph_floors.grpc_call_us(sidecar.target)
        finally:
            sidecar.shutdown()
            shutil.rmtree(scratch / "floor-sidecar", ignore_errors=True)
        out.update({f"grpc_call_{k}": v for k, v in grpc.items()})
    if server is not None:
        out.update({f"psycopg_call_{k}": v for k, v in langgraph_floors.psycopg_call_us(server.conninfo).items()})
    return out


def goals(figures: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    out = []
    for ours in ("ckpt-sidecar", "ckpt-embedded"):
        for peer in PEERS:
            if ours in figures and peer in figures:
                ratio = figures[peer]["bytes_per_checkpoint"] / figures[ours]["bytes_per_checkpoint"]
                out.append(_goal(ours, peer, "bytes_per_checkpoint", ratio, f"{peer}'s / {ours}'s", ">=", BYTES_TARGET))
    for ours, peer in LATENCY_PAIRS:
        if ours in figures and peer in figures:
            for op in ("put", "get_tuple"):
                for phase in ("x1", "many"):
                    metric = f"{op}_p50_us_{phase}"
                    ratio = figures[ours][metric] / figures[peer][metric]
                    out.append(_goal(ours, peer, metric, ratio, f"{ours}'s / {peer}'s", "<=", LATENCY_TARGET))
    return out


def _goal(
    ours: str, peer: str, metric: str, ratio: float, ratio_of: str, comparison: str, bound: float
) -> dict[str, Any]:
    holds = ratio >= bound if comparison == ">=" else ratio <= bound
    target = f"{comparison} {bound:g}"
    return {"ckpt": ours, "peer": peer, "metric": metric, "ratio": ratio, "ratio_of": ratio_of, "target": target,
            "holds": holds}  # fmt: skip


@contextlib.contextmanager
def _postgres(chosen: tuple[str, ...], scratch: Path) -> Iterator[postgres_server.PostgresServer | None]:
    if "postgres" not in chosen:
        yield None
        return
    with postgres_server.running(scratch) as server:
        yield server


def _systems(chosen: tuple[str, ...], server: postgres_server.PostgresServer | None) -> dict[str, SaverSystem]:
    plain: dict[str, type[CkptSidecarSystem | CkptEmbeddedSystem | SqliteSystem | LmdbSystem]] = {
        "ckpt-sidecar": CkptSidecarSystem,
        "ckpt-embedded": CkptEmbeddedSystem,
        "sqlite": SqliteSystem,
        "lmdb": LmdbSystem,
    }
    made: dict[str, SaverSystem] = {}
    for name in chosen:
        if name == "postgres":
            assert server is not None
            made[name] = PostgresSystem(server)
        else:
            made[name] = plain[name]()
    return made


def sizes(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with every size filled in: asked for, else --smoke's, else the default; checked."""
    base = SMOKE if args.smoke else DEFAULTS
    for key, value in base.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
        if getattr(args, key) < 1:
            raise ValueError(f"--{key.replace('_', '-')} must be at least 1, got {getattr(args, key)}")
    args.x1_threads = min(args.x1_threads, args.threads)
    args.history_threads = min(args.history_threads, args.threads)
    return args


def run(args: argparse.Namespace, argv: list[str], *, prog: str | None = None) -> dict[str, Any]:
    args = sizes(args)
    chosen = tuple(n for n in NAMES if n in (args.systems or NAMES))
    if "postgres" in chosen:
        postgres_server.find_bin_dir()  # PostgresMissing now, before the recording's minute
    corpus = trajectories.load(args.trajectories)
    started = time.time()
    print(f"recording {args.threads} threads x {args.steps} steps through LangGraph", file=sys.stderr, flush=True)
    records = record(corpus, threads=args.threads, steps=args.steps, prefix="bench-langgraph")
    record_seconds = time.time() - started
    scratch = (args.data_dir or data_root()) / f"langgraph-{os.getpid()}"
    per_round: dict[str, list[dict[str, Any]]] = {name: [] for name in chosen}
    floor_rounds: list[dict[str, float]] = []
    # The recorded threads' objects live as long as the run: left to the collector, each full
    # collection traverses them all (2.5-2.9 s here, several per saver round), stalling whichever put it
    # lands in. Frozen, they are out of every collection; what the savers allocate is collected as usual.
    gc.collect()
    gc.freeze()
    try:
        with _postgres(chosen, scratch) as server:
            systems = _systems(chosen, server)
            settings: dict[str, dict[str, Any]] = {}
            for r in range(args.rounds):
                order = list(systems) if r % 2 == 0 else list(reversed(systems))
                for name in order:
                    print(f"round {r + 1}/{args.rounds}: {name}", file=sys.stderr, flush=True)
                    per_round[name].append(one_round(systems[name], records, args, scratch))
                    # As found once a store was open (SQLite's pragmas; the server's settings).
                    settings[name] = systems[name].settings()
                print(f"round {r + 1}/{args.rounds}: floors", file=sys.stderr, flush=True)
                floor_rounds.append(floors(chosen, records[: args.x1_threads], per_round, server, scratch))
    finally:
        gc.unfreeze()  # a caller's process (a test's) collects as before
        shutil.rmtree(scratch, ignore_errors=True)
    figures = {name: medians(rs) for name, rs in per_round.items()}
    return {
        "command": f"{prog or 'python -m ckpt.bench.langgraph_bench'} " + " ".join(shlex.quote(a) for a in argv),
        "started_unix": started,
        "duration_seconds": time.time() - started,
        "record_seconds": record_seconds,
        "config": {
            "smoke": args.smoke,
            "rounds": args.rounds,
            "threads": args.threads,
            "steps": args.steps,
            "x1_threads": args.x1_threads,
            "history_threads": args.history_threads,
            "checkpoints_x1": sum(rec.puts for rec in records[: args.x1_threads]),
            "checkpoints_many": sum(rec.puts for rec in records),
            "put_writes_many": sum(len(rec.calls) - rec.puts for rec in records),
            "messages_per_thread": records[0].messages,
        },
        "machine": machine(),
        "workload": describe(records),
        "systems": {
            name: {
                "label": systems[name].label,
                "settings": settings.get(name, {}),
                "median": figures[name],
                "rounds": per_round[name],
            }
            for name in chosen
        },
        "goals": goals(figures),
        "floors": medians(floor_rounds) if floor_rounds else {},
    }


def describe(records: list[ThreadRecord]) -> dict[str, Any]:
    """The recorded workload: what the last checkpoint of a thread holds, in LangGraph's own serializer."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    serde = JsonPlusSerializer()
    last = [next(c for c in reversed(rec.calls) if isinstance(c, Put)).checkpoint for rec in records]
    sizes_ = [len(serde.dumps_typed(cp["channel_values"])[1]) for cp in last]
    return {
        "graph": "StateGraph: agent and tools nodes, each super-step appends one message (add_messages)",
        "source": "the shared trajectories, thread k from its k-th trajectory on",
        "last_state_bytes_mean": statistics.fmean(sizes_),
        "last_state_bytes_max": max(sizes_),
    }


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        cpu = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), cpu)
    versions = {}
    for dist in ("langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite", "langgraph-checkpoint-lmdb",
                 "langgraph-checkpoint-postgres", "psycopg", "lmdb", "grpcio"):  # fmt: skip
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[dist] = metadata.version(dist)
    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "versions": versions}  # fmt: skip


def main(argv: list[str] | None = None, *, prog: str | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = (parser(prog) if prog else parser()).parse_args(arguments)
    try:
        doc = run(args, arguments, prog=prog)
    except (ValueError, FileNotFoundError, postgres_server.PostgresMissing) as exc:
        print(f"langgraph_bench: {exc}", file=sys.stderr)
        return 2
    except AssertionError as exc:
        print(f"langgraph_bench: a read came back wrong: {exc}", file=sys.stderr)
        return 1
    print("\n".join(table(doc)))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / LANGGRAPH_JSON).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out / LANGGRAPH_JSON}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
