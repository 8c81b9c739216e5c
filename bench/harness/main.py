"""``ckpt bench``: run the harness, write results.json, REPORT.md and the plots.

ckpt bench run [--quick] [--workload W ...] [--systems S ...] [--mode merge|replace]
               [--concurrency N ...] [--sessions N] [--steps N] [--no-tuning] --out DIR
ckpt bench report --out DIR      (re-render REPORT.md and plots from DIR/results.json, and DIR/events.json
                                  of python -m ckpt.bench.events_bench if there is one)
ckpt bench scale [--sessions N]  (the store's 1,000,000-session run: python -m ckpt.bench.store_bench --only scale)
ckpt bench langgraph [...]       (LangGraph savers side by side: python -m ckpt.bench.langgraph_bench [...];
                                  `ckpt bench report` renders DIR/langgraph.json when it is there)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = "results.json"
# The tuning sweep's workloads and their full-run sizes (sessions, steps; None:
# the workload's own). The in-place editor runs 200 steps, past its first
# chain (max_depth 64): only chain restarts show what the knobs and
# compaction change for it; at its own 60 steps every knob but max_depth
# reads the same.
TUNING_WORKLOADS: dict[str, tuple[int, int] | None] = {"trajectories": None, "factual": (40, 200)}
REPORT = "REPORT.md"
PLOTS_DIR = "plots"


def parser() -> argparse.ArgumentParser:
    b = argparse.ArgumentParser(
        prog="ckpt bench",
        description="Replay agent workloads through ckpt and the stores people use today, side by side, and "
        "write results.json, REPORT.md and PNG plots. Needs the bench extra: pip install '/path/to/ckpt[bench]' "
        "from a checkout (make install does).",
    )
    bsub = b.add_subparsers(dest="bench_command", required=True, metavar="BENCH_COMMAND")
    r = bsub.add_parser("run", help="run workloads x systems and write the report", description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    r.add_argument("--out", type=Path, required=True, help="directory for results.json, REPORT.md and plots/")
    r.add_argument("--quick", action="store_true", help="small sizes (about a minute): a smoke run, not a report")
    r.add_argument("--workload", nargs="+", metavar="W", help="workloads (default: all)")
    r.add_argument("--systems", nargs="+", metavar="S", help="systems (default: all)")
    r.add_argument("--mode", choices=("merge", "replace"), default="merge", help="ckpt's write mode (default merge)")
    r.add_argument("--concurrency", nargs="+", type=int, metavar="N", help="agent counts (default 1 8 64)")
    r.add_argument("--sessions", type=int, help="sessions per workload (overrides its default size)")
    r.add_argument("--steps", type=int, help="steps per session (overrides its default size)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--cold-rounds", type=int, default=3, help="reopen-and-read rounds for cold latencies")
    r.add_argument("--no-tuning", action="store_true", help="skip the zstd level / chain policy sweep")
    r.add_argument("--trajectories", type=Path, help="trajectory corpus (default $CKPT_TRAJECTORIES or ../shared)")
    scratch_help = (
        "scratch directory for the stores (default: $CKPT_BENCH_DIR, else .bench-data/ in a source checkout,"
        " ~/.cache/ckpt-bench in an installed one; removed after)"
    )
    r.add_argument("--data-dir", type=Path, help=scratch_help)
    r.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    rep = bsub.add_parser("report", help="re-render REPORT.md and plots from results.json")
    rep.add_argument("--out", type=Path, required=True, help="directory holding results.json")
    sc = bsub.add_parser("scale", help="the 1,000,000-session store run (opt-in, ~5 minutes, ~2 GB of disk)")
    sc.add_argument("--sessions", type=int, default=1_000_000)
    sc.add_argument("--data-dir", type=Path, help="scratch directory (default $CKPT_BENCH_DIR or .bench-data)")
    lg = bsub.add_parser(
        "langgraph",
        add_help=False,
        help="LangGraph savers side by side: ckpt against SqliteSaver, LMDBSaver, PostgresSaver"
        " (ckpt bench langgraph --help)",
    )
    lg.add_argument("args", nargs=argparse.REMAINDER, help="python -m ckpt.bench.langgraph_bench's arguments")
    return b


def main(argv: list[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["langgraph"]:
        # Its own parser (and --help): the benchmark is the same run however it is started.
        from .. import langgraph_bench

        return langgraph_bench.main(arguments[1:], prog="ckpt bench langgraph")
    args = parser().parse_args(arguments)
    args.argv = arguments
    if args.bench_command == "scale":
        from .. import store_bench

        extra = ["--only", "scale", "--sessions", str(args.sessions)]
        if args.data_dir:
            extra += ["--data-dir", str(args.data_dir)]
        return int(store_bench.main(extra) or 0)
    try:
        import matplotlib  # noqa: F401

        from . import runner  # noqa: F401  (and what it imports; LangGraph's savers load when their systems open)
    except ImportError as exc:
        install = "pip install '/path/to/ckpt[bench]' (a checkout), or make install"
        print(f"ckpt bench: {exc.name} is missing; install the bench extra: {install}", file=sys.stderr)
        return 2
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.bench_command == "report":
        doc = json.loads((out / RESULTS).read_text())
        write_report(doc, out)
        return 0
    try:
        doc = run(args)
    except ValueError as exc:
        print(f"ckpt bench run: {exc}", file=sys.stderr)
        return 2
    (out / RESULTS).write_text(json.dumps(doc, indent=1) + "\n")
    write_report(doc, out)
    print(f"wrote {out / REPORT}, {out / RESULTS} and {out / PLOTS_DIR}/ in {doc['duration_seconds']:.0f} s")
    return 0


def run(args: argparse.Namespace) -> dict[str, Any]:
    from .. import store_bench, trajectories
    from . import runner, systems, tuning, workloads

    chosen_workloads = tuple(args.workload or workloads.WORKLOADS)
    skipped: dict[str, str] = {}
    if "trajectories" in chosen_workloads or not args.no_tuning:
        problem = trajectories.corpus_problem(args.trajectories)
        if problem is not None:
            if args.trajectories is not None or "trajectories" in (args.workload or ()):
                raise ValueError(problem)  # asked for by name: a mistake to report, not to skip past
            # A machine without the corpus (a plain install) still measures the synthetic workloads.
            print(f"ckpt bench run: skipping the trajectories workload: {problem}", file=sys.stderr)
            skipped["trajectories"] = problem
            chosen_workloads = tuple(w for w in chosen_workloads if w not in skipped)
    chosen_systems = tuple(args.systems or systems.SYSTEMS)
    # Scratch stores go where the other benchmarks put theirs (real disk, git-ignored), not into --out.
    scratch = args.data_dir or store_bench.data_root() / f"harness-{os.getpid()}"
    config = runner.RunConfig(
        workloads=chosen_workloads,
        systems=chosen_systems,
        data_dir=scratch,
        quick=args.quick,
        mode=args.mode,
        concurrency=tuple(args.concurrency or runner.DEFAULT_CONCURRENCY),
        seed=args.seed,
        sessions=args.sessions,
        steps=args.steps,
        cold_rounds=args.cold_rounds,
        trajectories_dir=args.trajectories,
    )
    started = time.time()
    try:
        doc = runner.run(config, progress=not args.no_progress)
        if not args.no_tuning:
            # The real trajectories (mostly appends) and the in-place editor (where a MERGE
            # state grows by every patch) pull the chain policy in different directions.
            doc["tuning"] = []
            for tuning_workload, tuning_size in TUNING_WORKLOADS.items():
                if tuning_workload in skipped:
                    continue
                sessions, steps = config.size_of(tuning_workload)
                if tuning_size is not None and not args.quick:
                    sessions, steps = args.sessions or tuning_size[0], args.steps or tuning_size[1]
                data = workloads.generate(
                    tuning_workload, sessions=sessions, steps=steps, seed=args.seed, trajectories_dir=args.trajectories
                )
                points = tuning.points(quick=args.quick)
                bar = runner.Progress(len(points), enabled=not args.no_progress)
                doc["tuning"].append(
                    {
                        "workload": tuning_workload,
                        "sessions": sessions,
                        "steps": steps,
                        "points": tuning.sweep(data, scratch, quick=args.quick, seed=args.seed, progress=bar),
                    }
                )
    finally:
        if args.data_dir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    if skipped:
        doc["skipped_workloads"] = skipped
    doc["duration_seconds"] = time.time() - started
    doc["command"] = "ckpt bench " + " ".join(shlex.quote(a) for a in args.argv)
    return doc


def write_report(doc: dict[str, Any], out: Path) -> None:
    from .. import langgraph_table
    from . import events_report, plots, report

    written = plots.write_all(doc, out / PLOTS_DIR)
    command = doc.get("command") or "ckpt bench run"
    # The events benchmark (python -m ckpt.bench.events_bench --out DIR) runs on its own; its section
    # is rendered when it has written its results beside these.
    # So does the LangGraph savers' benchmark (python -m ckpt.bench.langgraph_bench --out DIR).
    events = events_report.load(out)
    langgraph = langgraph_table.load(out)
    plot_paths = {k: f"{PLOTS_DIR}/{v}" for k, v in written.items()}
    text = report.render(doc, plots=plot_paths, command=command, events=events, langgraph=langgraph)
    (out / REPORT).write_text(text)
