"""The sidecar benchmark's two-process reading: its merges reach both sidecars, its CPU counts both.

It is the measurement behind the README's answer to `--workers`, so a bench
that silently sent every merge to one sidecar would make that answer wrong.
"""

from __future__ import annotations

import math
from pathlib import Path

from bench import sidecar_bench
from bench.output import proc_cpu_seconds


def test_two_process_merges_split_across_both_sidecars(tmp_path: Path) -> None:
    first = sidecar_bench._start(tmp_path, "first")
    second = sidecar_bench._start(tmp_path, "second")
    bench = sidecar_bench.Bench(first, quick=True, second=second)
    try:
        bench.seed()
        workers = bench.merge_workers(bench.clients)
        assert len(workers) == sidecar_bench.CLIENTS
        cpu_before = [proc_cpu_seconds(p.pid) for p in (first, second)]
        t = sidecar_bench.run_threads(workers, 0.3, [first.pid, second.pid])
        cpu_after = [proc_cpu_seconds(p.pid) for p in (first, second)]
        assert t.calls > 0
        assert math.isfinite(t.server_cpu_us_per_call) and t.server_cpu_us_per_call > 0
        # Each sidecar's own CPU moved: the reading sums both processes, not one twice.
        for before, after in zip(cpu_before, cpu_after, strict=True):
            assert before is not None and after is not None and after > before

        merged = 0
        for i in range(sidecar_bench.CLIENTS):
            session = sidecar_bench._merge_session(i)
            owner, other = bench.clients[i % 2], bench.clients[1 - i % 2]
            head = owner.get(session).version
            assert head >= 2, f"{session}: thread {i} merged nothing into its own sidecar"
            assert other.get(session).version == 1, f"{session}: the other sidecar got merges too"
            merged += head - 1
        assert merged == t.calls
    finally:
        bench.close()
        for sidecar in (first, second):
            assert sidecar.stop() == 0, sidecar.log(tail_chars=2000)


def test_cpu_seconds_sums_the_processes_and_is_nan_for_a_missing_one(tmp_path: Path) -> None:
    sidecar = sidecar_bench._start(tmp_path, "one")
    try:
        one = sidecar_bench._cpu_seconds([sidecar.pid])
        assert one > 0
        assert sidecar_bench._cpu_seconds([sidecar.pid, sidecar.pid]) >= 2 * one
    finally:
        assert sidecar.stop() == 0
    assert math.isnan(sidecar_bench._cpu_seconds([sidecar.pid]))  # reaped: no /proc entry left
