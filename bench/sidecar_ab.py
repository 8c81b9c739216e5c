"""Two builds of the sidecar side by side: this checkout against another commit.

    python -m ckpt.bench.sidecar_ab REF [--rounds N] [--seconds S] [--json FILE]
                               [--baseline-args ARGS] [--this-args ARGS]

On the project's 2-core VMs one build's unary merges/s move ~20% between
runs of `python -m ckpt.bench.sidecar_bench`, more than most changes move them, so
a change is judged against its baseline measured in the same minutes. REF (a
commit, branch or tag of this repository) is checked out into a temporary git
worktree, removed when done; each build serves as its own echo sidecar
(``bench.echo_sidecar``, or ``ckpt serve --bench-echo`` for a build from
before that launcher) on its defaults (fsync on; data under
``$CKPT_BENCH_DIR``, else ``.bench-data/``), both started before anything is
measured. Each round measures each build in turn, the one going first
alternating round by round: 64 client threads echoing a merge request's size,
then 64 threads of unary MERGE (sessions re-seeded with ~10 KB states), then
PutStream MERGE writes, each after a short warm-up of its own kind, with
``python -m ckpt.bench.sidecar_bench``'s own ``Bench.measure``; then the hot
Get of a ~300 KB cached state against an echo of as many bytes (p50 of 300
alternating pairs, ``Bench.hot_get``).

The report gives each build's medians (merges/s, echo calls/s, merge/echo,
server CPU per call, PutStream writes/s, hot Get and echo p50) and, round by
round, this build's merges/s, merge/echo, PutStream and hot Get p50 over the
baseline's: a change that helps shows up as paired
ratios above 1 in most rounds. Nothing is checked: it exits 0.

``--baseline-args`` and ``--this-args`` add ``ckpt serve`` options to one
build (a shell-quoted string): with REF = HEAD, that compares two settings
of one build, e.g. ``--this-args '--max-commit-delay-seconds 0'`` (a single
option, with no value after a space, needs the ``=`` form: ``--this-args=--event-loop=asyncio``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..sidecar.server import SidecarProcess
from .echo_sidecar import start_echo_sidecar, stop_echo_sidecar
from .output import finish, process_and_children
from .sidecar_bench import data_root, machine_info
from .sidecar_load import Bench

REPO = Path(__file__).resolve().parent.parent
BUILDS = ("baseline", "this")
METRICS = (
    "echo",
    "merge",
    "merge_vs_echo",
    "echo_cpu_us",
    "merge_cpu_us",
    "stream",
    "hot_get_p50_us",
    "hot_echo_p50_us",
)
#: What the paired ratios (this build / the baseline, round by round) are given for.
PAIRED = ("merge", "merge_vs_echo", "stream", "hot_get_p50_us")


@dataclass
class Report:
    machine: dict[str, Any]
    params: dict[str, Any]
    #: build -> metric (METRICS) -> one value per round.
    builds: dict[str, dict[str, list[float]]]
    #: metric -> this build's value over the baseline's, per round.
    paired: dict[str, list[float]]
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)  # none: finish() exits 0


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


@contextlib.contextmanager
def worktree(ref: str) -> Iterator[Path]:
    """``ref`` checked out (detached) in a temporary directory, for as long as the block runs."""
    path = Path(tempfile.mkdtemp(prefix="ckpt-ab-"))
    try:
        _git("worktree", "add", "--detach", "--quiet", str(path), ref)
        yield path
    finally:
        with contextlib.suppress(RuntimeError):
            _git("worktree", "remove", "--force", str(path))
        shutil.rmtree(path, ignore_errors=True)


def run(
    ref: str,
    *,
    rounds: int = 6,
    seconds: float = 2.0,
    warmup: float = 0.3,
    root: Path | None = None,
    extra: dict[str, tuple[str, ...]] | None = None,
) -> Report:
    if rounds < 1 or seconds <= 0 or warmup < 0:
        raise ValueError(f"rounds must be >= 1 and seconds > 0, warmup >= 0; got {rounds}, {seconds}, {warmup}")
    base = root or data_root()
    base.mkdir(parents=True, exist_ok=True)
    baseline_commit = _git("rev-parse", "--verify", f"{ref}^{{commit}}")
    results: dict[str, dict[str, list[float]]] = {b: {m: [] for m in METRICS} for b in BUILDS}
    with worktree(baseline_commit) as source:
        sidecars: dict[str, SidecarProcess] = {}
        ok = False
        try:
            # One at a time: if the second cannot start, the first is stopped below.
            options = extra or {}
            sidecars["baseline"] = start_echo_sidecar(
                base, f"ab-baseline-{os.getpid()}", source=source, extra=options.get("baseline", ())
            )
            sidecars["this"] = start_echo_sidecar(base, f"ab-this-{os.getpid()}", extra=options.get("this", ()))
            params: dict[str, Any] = {
                "baseline_ref": ref,
                "baseline_commit": baseline_commit,
                "this_commit": _git("rev-parse", "HEAD"),
                "this_tree_changed": bool(_git("status", "--porcelain", "--untracked-files=no")),
                "rounds": rounds,
                "seconds": seconds,
                "serve_options": {b: list(options.get(b, ())) for b in BUILDS},
                "warmup_seconds": warmup,
                # Where each server runs (what `python -m` imports): the proof each build is the one named.
                "cwd": {b: os.readlink(f"/proc/{sc.pid}/cwd") for b, sc in sidecars.items()},
            }
            benches = {b: Bench(sc, quick=True) for b, sc in sidecars.items()}
            try:
                for r in range(rounds):
                    for b in BUILDS if r % 2 == 0 else tuple(reversed(BUILDS)):
                        _round(benches[b], results[b], seconds, warmup)
            finally:
                for bench in benches.values():
                    bench.close()
            ok = True
        finally:
            for sidecar in sidecars.values():
                stop_echo_sidecar(sidecar, ok=ok)
    paired = {m: [t / b for t, b in zip(results["this"][m], results["baseline"][m], strict=True)] for m in PAIRED}
    return Report(machine=machine_info(), params=params, builds=results, paired=paired)


def _round(bench: Bench, out: dict[str, list[float]], seconds: float, warmup: float) -> None:
    one = process_and_children(bench.pid)  # its store process too: a merge's CPU is spent in both
    echo = bench.measure(
        lambda: bench.echo_workers(bench.echo_request_size), seeded=False, pids=one, seconds=seconds, warmup=warmup
    )
    merge = bench.measure(bench.merge_workers, seeded=True, pids=one, seconds=seconds, warmup=warmup)
    out["echo"].append(echo.rate)
    out["merge"].append(merge.rate)
    out["merge_vs_echo"].append(merge.rate / echo.rate)
    out["echo_cpu_us"].append(echo.server_cpu_us_per_call)
    out["merge_cpu_us"].append(merge.server_cpu_us_per_call)
    out["stream"].append(
        bench.measure(bench.stream_workers, seeded=True, pids=one, seconds=seconds, warmup=warmup).rate
    )
    hot = bench.hot_get()  # a ~300 KB cached state's latest-version Get against an echo of as many bytes
    out["hot_get_p50_us"].append(hot["get_p50_us"])
    out["hot_echo_p50_us"].append(hot["echo_p50_us"])


def render(report: Report) -> str:
    p, r = report.params, report.builds
    changed = " (with uncommitted changes)" if p["this_tree_changed"] else ""
    lines = [
        f"machine: {report.machine}",
        f"baseline: {p['baseline_ref']} = {p['baseline_commit'][:12]}; this: {p['this_commit'][:12]}{changed}",
        *(f"{b}: ckpt serve {shlex.join(p['serve_options'][b])}" for b in BUILDS if p.get("serve_options", {}).get(b)),
        f"{p['rounds']} rounds x {p['seconds']:g} s per measurement, each build in turn, first one alternating",
        "",
        "| build | merges/s | echo calls/s | merge/echo | server CPU us/merge (both processes) | server CPU us/echo"
        " | PutStream writes/s | hot 300 KB Get p50 us | its echo p50 us |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for b in BUILDS:
        med = {m: statistics.median(r[b][m]) for m in METRICS}
        lines.append(
            f"| {b} | {med['merge']:,.0f} | {med['echo']:,.0f} | {med['merge_vs_echo']:.2f} | "
            f"{med['merge_cpu_us']:.0f} | {med['echo_cpu_us']:.0f} | {med['stream']:,.0f} | "
            f"{med['hot_get_p50_us']:.0f} | {med['hot_echo_p50_us']:.0f} |"
        )
    lines += [
        "",
        "| round | merges/s this / baseline | merge/echo this / baseline | PutStream writes/s this / baseline"
        " | hot Get p50 this / baseline |",
        "|---:|---:|---:|---:|---:|",
    ]
    for i, row in enumerate(zip(*(report.paired[m] for m in PAIRED), strict=True)):
        lines.append(f"| {i + 1} | " + " | ".join(f"{x:.3f}" for x in row) + " |")
    above = sum(1 for x in report.paired["merge"] if x > 1)
    lines.append(
        f"\nmedian of the paired merges/s ratios: {statistics.median(report.paired['merge']):.3f}"
        f" (above 1 in {above} of {len(report.paired['merge'])} rounds); of the paired merge/echo ratios:"
        f" {statistics.median(report.paired['merge_vs_echo']):.3f}; of PutStream writes/s:"
        f" {statistics.median(report.paired['stream']):.3f}; of hot Get p50 (below 1: faster):"
        f" {statistics.median(report.paired['hot_get_p50_us']):.3f}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ref", help="the baseline: a commit, branch or tag of this repository")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of both builds (default 6)")
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per echo and per merge measurement")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--baseline-args", default="", help="more `ckpt serve` options for the baseline (quoted)")
    parser.add_argument("--this-args", default="", help="more `ckpt serve` options for this build (quoted)")
    args = parser.parse_args(argv)
    extra = {"baseline": tuple(shlex.split(args.baseline_args)), "this": tuple(shlex.split(args.this_args))}
    try:
        report = run(args.ref, rounds=args.rounds, seconds=args.seconds, extra=extra)
    except (RuntimeError, ValueError) as exc:
        print(f"sidecar_ab: {exc}", file=sys.stderr)
        return 2
    return finish(report, render(report), args.json)


if __name__ == "__main__":
    sys.exit(main())
