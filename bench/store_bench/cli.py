"""Store benchmarks: group commit, cold hydration, and a million sessions, on real disk.

    python -m ckpt.bench.store_bench [--quick] [--sessions N] [--data-dir DIR] [--json FILE]
                                     [--trajectories DIR] [--only NAME ...]

Every LMDB environment lives under ``--data-dir``, else ``$CKPT_BENCH_DIR``,
else ``.bench-data/`` at the repository root (git-ignored); each benchmark
starts from a fresh directory there and removes it when done. Every figure is
measured in this run on this machine: times are medians (or percentiles) of
repetitions, and compared configurations run side by side, alternating.

1. group-commit: 64 writer threads, each writing versions of its own session
   (growing ~2.6-10 KB Checkpoint states from ``bench.synthetic``), fsync on
   (``Durability.SYNC``, the default). The default config (writes share
   commits) against ``max_batch_writes=1`` (one transaction, so one fsync
   pair, per put), alternating rounds on fresh directories; writes/s, the
   ratio (checked), and the batch sizes the writer committed. The same pair
   again with 64 asyncio tasks awaiting ``Store.asubmit`` on one event loop,
   the way the sidecar writes (reported, not checked). The flush latency of
   the disk under the data directory is printed too: the ratio depends on it.
   So is the ceiling (reported): the default config again with its data on
   tmpfs (``/dev/shm``, where a flush costs nothing), against the same
   commit-per-put rate: about what group commit could reach on this machine
   if its own flushes were free, i.e. the ratio its CPU per write allows.
2. cold-hydration: the trajectory whose final state is closest to 300 KB,
   written as REPLACE and as MERGE sessions, store closed and reopened with
   ``cache_size_bytes=0``; ``Store.get`` of the version ending the default
   policy's longest chain (chains found from ``list_versions`` frame kinds;
   also the last chain the policy ended, which holds the largest states),
   against ``codec.decode`` of one FULL frame of the same state, with the
   codec's decode of the same chain's frames alongside. "Cold" means
   the store's state cache is bypassed (LMDB read transaction + chain decode
   on every get); the OS page cache is warm.
3. scale: fill N sessions (1,000,000 by default) of ~2-3 KB Checkpoint states,
   3 versions each (a REPLACE of the whole state, then two MERGE patches that
   append a message: FULL, PATCH, PATCH under the default policy), with
   ``put_many`` batches of about 2,000 writes. Sessions are inserted in
   increasing key order (zero-padded ids) and each session's versions are
   consecutive within one batch, so LMDB's inserts are sequential and fill its
   pages well: the best case (writers interleaving across sessions insert into
   the middle of the frames table, and LMDB's half-full splits use more disk).
   So the same writes are also made interleaved, reported and not checked:
   up to 100,000 sessions on a fresh store, 20,000 open at once, each
   ``put_many`` taking the next versions of randomly drawn open sessions.
   Random cold reads (latest, and a random older version) are timed at
   10,000 sessions and at N, each size its own store filled by the same
   writes in the same order (the first is the second as it was at 10,000;
   ``cache_size_bytes=0`` throughout), in four passes each: "as filled"
   (the page cache as the fill left it), "from disk" (store closed, the data
   file's pages dropped from the page cache with posix_fadvise, store
   reopened: as after a reboot), "file pre-read" (after one sequential
   read of the data file: every page cached; a read that still waited on
   the disk, its page evicted since, is counted and left out of the pass's
   percentiles), and, once both are filled,
   "each read from disk" (3,000 picks per size: its p99 the 31st slowest, the two stores taking turns
   pick by pick so that the shared disk's slow minutes fall on both; before
   every get the store is closed, the file's pages dropped and the store
   reopened). Reads that had to wait on the
   disk are counted (major faults). The p99 growth checked is the larger of
   the two passes whose reads find the page cache alike at both sizes ("each
   read from disk": nothing cached; "file pre-read": everything cached).
   "From disk" is reported, not checked: its reads cache pages for the
   later ones, and a 10,000-session file is soon all cached (about one read
   in five waits on the disk there, nearly all at 1,000,000), so it compares
   mostly cached reads against disk reads. "As filled" neither: it compares
   pages written moments before (the first 10,000) against pages written
   minutes before, and a kernel that pages out idle memory (DAMON
   ``pageout``; the policy in force is printed with the machine) has evicted
   some of the latter, so it measures page age rather than session count.
   The data file's size against the frames it holds is checked too.
4. merge-cost: one store per head-state size (10 KB, 100 KB, 1 MB of
   Checkpoint), all open at once; each round, each store in turn takes
   ``put_many`` of 10 MERGEs of ~300 B to each of 64 sessions (request ids,
   fsync on), in alternating order; us per merge, and the 1 MB / 10 KB ratio
   (DESIGN.md: a MERGE costs O(change), not O(state)).
5. quiet-keyframes: every trajectory one session, written in bursts of 3-12
   steps to stores side by side (the default config; quiet keyframes; quiet
   keyframes with chains allowed twice the decode cost), the keyframe stores
   swept after each burst as if the pause had passed, then every session that
   wrote read back cold from each: bytes per version and the resume read's
   p50/p99, REPLACE and MERGE.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import lmdb

from .. import trajectories
from ..output import finish
from .commits import group_commit, render_group_commit
from .common import DEFAULT_DIR, DEFAULT_SESSIONS, ENV_DIR, check, damon_pageout, data_root
from .hydration import cold_hydration, render_cold_hydration
from .keyframes import quiet_keyframes, render_quiet_keyframes
from .merges import merge_cost, render_merge_cost
from .scaling import render_scale, scale

QUICK_SESSIONS = 20_000
BENCHMARKS = ("group-commit", "cold-hydration", "scale", "merge-cost", "quiet-keyframes")


@dataclass
class Report:
    machine: dict[str, str]
    data_dir: str
    notes: list[str] = field(default_factory=list)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)


def _progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    sessions: int | None = None,
    quick: bool = False,
    trajectory_dir: str | None = None,
    only: Iterable[str] = BENCHMARKS,
    progress: Callable[[str], None] | None = _progress,
) -> Report:
    root = data_root(data_dir)
    only = set(only)
    report = Report(
        machine={
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": str(os.cpu_count()),
            "lmdb": ".".join(map(str, lmdb.version())),
            "idle_pageout": damon_pageout(),
        },
        data_dir=str(root),
    )
    say = progress or (lambda _: None)
    if "group-commit" in only:
        say("group commit ...")
        r = group_commit(root, versions=20 if quick else 60, rounds=3 if quick else 5)
        report.results["group_commit"] = r
        report.checks["group_commit_speedup"] = check("group_commit_speedup", r["speedup"])
    if "cold-hydration" in only:
        say("cold hydration ...")
        try:
            report.results["cold_hydration"] = cold_hydration(root, trajectory_dir, reps=11 if quick else 51)
        except FileNotFoundError as exc:
            report.notes.append(f"cold hydration skipped: {exc}")
    if "scale" in only:
        n = sessions if sessions is not None else (QUICK_SESSIONS if quick else DEFAULT_SESSIONS)
        say(f"scale: {n:,} sessions ...")
        r = scale(root, n, reads=5_000 if quick else 20_000, cold_reads=300 if quick else 3_000, progress=progress)
        report.results["scale"] = r
        report.checks["p99_growth_latest"] = check("p99_growth_latest", r["p99_growth_latest"])
        report.checks["p99_growth_old_version"] = check("p99_growth_old_version", r["p99_growth_old_version"])
        report.checks["data_file_vs_frames"] = check("data_file_vs_frames", r["disk"][-1]["file_vs_frames"])
    if "merge-cost" in only:
        say("merge cost ...")
        r = merge_cost(root, rounds=4 if quick else 7)
        report.results["merge_cost"] = r
        report.checks["merge_cost_growth"] = check("merge_cost_growth", r["growth"])
    if "quiet-keyframes" in only:
        say("quiet keyframes ...")
        try:
            report.results["quiet_keyframes"] = quiet_keyframes(root, trajectory_dir)
        except FileNotFoundError as exc:
            report.notes.append(f"quiet keyframes skipped: {exc}")
    return report


def render_checks(checks: dict[str, dict[str, Any]]) -> str:
    lines = ["\n## targets", "| check | measured | target | ok |", "|---|---:|---:|---|"]
    lines += [
        f"| {k} | {c['measured']:.3f} | {c['target']} | {'yes' if c['ok'] else 'NO'} |" for k, c in checks.items()
    ]
    return "\n".join(lines)


def render(report: Report) -> str:
    lines = [f"machine: {report.machine}", f"data dir: {report.data_dir}"]
    lines += [f"note: {n}" for n in report.notes]
    renderers = {
        "group_commit": render_group_commit,
        "cold_hydration": render_cold_hydration,
        "scale": render_scale,
        "merge_cost": render_merge_cost,
        "quiet_keyframes": render_quiet_keyframes,
    }
    lines += [renderers[name](r) for name, r in report.results.items()]
    if report.checks:
        lines.append(render_checks(report.checks))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ckpt.bench.store_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help=f"fewer rounds and reads; {QUICK_SESSIONS:,} sessions")
    parser.add_argument("--sessions", type=int, help=f"sessions for the scale benchmark (default {DEFAULT_SESSIONS:,})")
    parser.add_argument("--data-dir", help=f"where the LMDB directories go (default: ${ENV_DIR} or {DEFAULT_DIR})")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument(
        "--trajectories", help=f"corpus directory (default: ${trajectories.ENV_VAR} or {trajectories.DEFAULT_DIR})"
    )
    parser.add_argument("--only", nargs="+", choices=BENCHMARKS, default=list(BENCHMARKS), help="run only these")
    args = parser.parse_args(argv)
    if args.sessions is not None and args.sessions < 1:
        parser.error("--sessions must be >= 1")
    t0 = time.perf_counter()
    report = run(
        args.data_dir, sessions=args.sessions, quick=args.quick, trajectory_dir=args.trajectories, only=args.only
    )
    return finish(report, f"{render(report)}\n\ntotal {time.perf_counter() - t0:.0f} s", args.json)
