"""``ckpt serve --workers N`` against one process, side by side: echo and unary MERGE over TCP.

    python -m ckpt.bench.workers_bench [--workers N] [--rounds R] [--quick] [--json FILE]

Two echo sidecars (``bench.echo_sidecar``) serve at once, each with its own data directory
(as sidecar_bench's, fsync on) and a free TCP port on 127.0.0.1: one process,
and ``--workers N``. The 64 client threads share 16 connections
(``CheckpointClient(own_connection=True)``, as 16 agent processes would have):
the kernel gives each connection to one worker, so one connection would
measure one worker. Each round measures on each sidecar in turn (the first
alternating round by round): the echo of a merge request's size, then unary
MERGE (~300 B patches onto ~10 KB states, re-seeded before each reading), each
after a warm-up of its kind. Reported: medians over the rounds, each round's
workers/one ratios, merge/echo for each sidecar, and the server CPU per call
(the parent and its workers summed). Then the hot Get of a 1 KB state from
each sidecar's state cache, one client, calls alternating: what a worker's
check of its cached state against LMDB adds.

The acceptance's merge/echo target compares a merge with an echo served by the
same configuration; this says what ``--workers`` changes for both.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..sidecar.server import SidecarProcess
from .echo_sidecar import start_echo_sidecar
from .output import child_pids, finish, process_and_children
from .sidecar_bench import data_root, machine_info
from .sidecar_load import CLIENTS, Bench, Throughput
from .stats import percentile

CONNECTIONS = 16
HOT_STATE = b"h" * 1000


@dataclass
class Report:
    machine: dict[str, Any]
    params: dict[str, Any]
    rounds: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    medians: dict[str, dict[str, float]] = field(default_factory=dict)
    ratios: dict[str, float] = field(default_factory=dict)
    #: Hot Get of a small state, one client, calls alternating between the sidecars: p50/p99 in us.
    hot_get: dict[str, dict[str, float]] = field(default_factory=dict)
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)  # none: informational


class Target:
    """One sidecar: its processes (the parent and its workers) and a sidecar_bench Bench over CONNECTIONS
    connections of its own."""

    def __init__(self, sidecar: SidecarProcess, *, workers: int, quick: bool) -> None:
        self.sidecar = sidecar
        #: The worker processes (none for one process).
        self.workers = child_pids(sidecar.pid) if workers > 1 else []
        if len(self.workers) != (0 if workers == 1 else workers):
            raise RuntimeError(f"expected {workers} worker(s) under pid {sidecar.pid}, found {self.workers}")
        #: Every server process: the parent, its workers, and their store processes.
        self.pids = process_and_children(sidecar.pid)
        self.bench = Bench(sidecar, quick=quick, connections=CONNECTIONS)

    def close(self) -> None:
        self.bench.close()

    def measure(self, kind: str) -> Throughput:
        """Echo of a merge request's size, or unary MERGE (sessions re-seeded), as sidecar_bench reads them."""
        b = self.bench
        if kind == "echo":
            return b.measure(lambda: b.echo_workers(b.echo_request_size), seeded=False, pids=self.pids)
        return b.measure(b.merge_workers, seeded=True, pids=self.pids)


def hot_get(targets: dict[str, Target], pairs: int) -> dict[str, dict[str, float]]:
    """Latest version of a 1 KB state from each sidecar's state cache, alternating: what a worker's
    check of its cached state against LMDB adds to a Get."""
    for t in targets.values():
        t.bench.client.put("hot", HOT_STATE)
        for _ in range(200):  # warm: the state cache, the connection
            t.bench.client.get("hot")
    us: dict[str, list[float]] = {name: [] for name in targets}
    for i in range(pairs):
        for name in list(targets) if i % 2 == 0 else reversed(list(targets)):
            client = targets[name].bench.client
            began = time.perf_counter_ns()
            client.get("hot")
            us[name].append((time.perf_counter_ns() - began) / 1000)
    return {name: {"p50_us": percentile(v, 50), "p99_us": percentile(v, 99)} for name, v in us.items()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(base: Path, name: str, workers: int) -> SidecarProcess:
    return start_echo_sidecar(
        base,
        name,
        extra=("--workers", str(workers)) if workers > 1 else (),
        listen=f"127.0.0.1:{_free_port()}",
    )


def run(*, workers: int = 2, rounds: int = 5, quick: bool = False, root: Path | None = None) -> Report:
    if workers < 2:
        raise ValueError(f"workers must be >= 2 (compared with one process), got {workers}")
    base = (root or data_root()).resolve()
    base.mkdir(parents=True, exist_ok=True)
    names = {"one": 1, f"workers_{workers}": workers}
    sidecars: dict[str, SidecarProcess] = {}
    targets: dict[str, Target] = {}
    try:
        for name, n in names.items():
            sidecars[name] = _start(base, f"workers-bench-{os.getpid()}-{name}", n)
            targets[name] = Target(sidecars[name], workers=n, quick=quick)
        bench = targets["one"].bench
        report = Report(
            machine=machine_info(),
            params={
                "workers": workers,
                "rounds": rounds,
                "clients": CLIENTS,
                "connections": CONNECTIONS,
                "seconds_per_reading": bench.seconds,
                "warmup_seconds": bench.warmup,
                "state_bytes": len(bench.state),
                "merge_request_bytes": len(bench.echo_request_size),
            },
        )
        report.rounds = {name: [] for name in names}
        for r in range(rounds):
            order = list(names) if r % 2 == 0 else list(reversed(names))
            for name in order:
                echo = targets[name].measure("echo")
                merge = targets[name].measure("merge")
                report.rounds[name].append(
                    {
                        "echo_per_s": echo.rate,
                        "merge_per_s": merge.rate,
                        "echo_server_cpu_us": echo.server_cpu_us_per_call,
                        "merge_server_cpu_us": merge.server_cpu_us_per_call,
                        "echo_client_cpu_us": echo.client_cpu_us_per_call,
                        "merge_client_cpu_us": merge.client_cpu_us_per_call,
                    }
                )
                print(f"round {r + 1}/{rounds} {name}: echo {echo.rate:,.0f}/s merge {merge.rate:,.0f}/s", flush=True)
        for name, readings in report.rounds.items():
            report.medians[name] = {k: statistics.median(x[k] for x in readings) for k in readings[0]}
            report.ratios[f"merge_vs_echo_{name}"] = (
                report.medians[name]["merge_per_s"] / report.medians[name]["echo_per_s"]
            )
        many = f"workers_{workers}"
        report.hot_get = hot_get(targets, 500 if quick else 2000)
        report.ratios[f"hot_get_p50_{many}_vs_one"] = report.hot_get[many]["p50_us"] / report.hot_get["one"]["p50_us"]
        for kind in ("merge", "echo"):
            paired = [
                w[f"{kind}_per_s"] / o[f"{kind}_per_s"]
                for w, o in zip(report.rounds[many], report.rounds["one"], strict=True)
            ]
            report.ratios[f"{kind}_{many}_vs_one_paired_median"] = statistics.median(paired)
        return report
    finally:
        for t in targets.values():
            t.close()
        for sidecar in sidecars.values():
            code = sidecar.stop()
            if code != 0:
                print(f"sidecar exited with {code}; log kept at {sidecar.log_path}", file=sys.stderr)
            else:
                shutil.rmtree(sidecar.data_dir, ignore_errors=True)
                sidecar.log_path.unlink(missing_ok=True)


def render(report: Report) -> str:
    p, m, r = report.params, report.medians, report.ratios
    many = f"workers_{p['workers']}"
    lines = [
        f"machine: {report.machine}",
        f"params: {p}",
        "",
        f"## one process against --workers {p['workers']}: TCP, {p['clients']} threads over {p['connections']}"
        f" connections, medians of {p['rounds']} rounds x {p['seconds_per_reading']:g} s",
        "| sidecar | echo/s | merges/s | merge/echo | server CPU us/echo | server CPU us/merge |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in ("one", many):
        x = m[name]
        lines.append(
            f"| {name.replace('_', ' ')} | {x['echo_per_s']:,.0f} | {x['merge_per_s']:,.0f} |"
            f" {r[f'merge_vs_echo_{name}']:.2f} | {x['echo_server_cpu_us']:.0f} | {x['merge_server_cpu_us']:.0f} |"
        )
    for kind in ("merge", "echo"):
        paired = [
            f"{w[f'{kind}_per_s'] / o[f'{kind}_per_s']:.2f}"
            for w, o in zip(report.rounds[many], report.rounds["one"], strict=True)
        ]
        lines.append(
            f"{kind}s/s, workers/one per round: {' '.join(paired)}; median"
            f" {r[f'{kind}_{many}_vs_one_paired_median']:.2f}"
        )
    hot = report.hot_get
    lines.append(
        f"hot Get of a 1 KB state (one client, alternating): p50 {hot['one']['p50_us']:.0f} us one process,"
        f" {hot[many]['p50_us']:.0f} us workers ({r[f'hot_get_p50_{many}_vs_one']:.2f}x); p99"
        f" {hot['one']['p99_us']:.0f} / {hot[many]['p99_us']:.0f} us"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="workers of the second sidecar (default 2)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--quick", action="store_true", help="0.8 s readings instead of 3 s")
    parser.add_argument("--json", help="also write the raw results here")
    args = parser.parse_args(argv)
    report = run(workers=args.workers, rounds=args.rounds, quick=args.quick)
    return finish(report, render(report), args.json)


if __name__ == "__main__":
    sys.exit(main())
