"""Store benchmarks (opt-in: `make bench`, or pytest -m benchmark tests/bench/).

Each test runs one benchmark of bench.store_bench on real disk (under
$CKPT_BENCH_DIR, else .bench-data/ at the repository root), prints its table
and checks the targets of the store issue's acceptance. The scale test fills
$CKPT_BENCH_SESSIONS sessions (default 1,000,000; set it lower for a quick run).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckpt.bench import store_bench

pytestmark = pytest.mark.benchmark


@pytest.fixture(scope="module")
def bench_root() -> Path:
    return store_bench.data_root()


def test_group_commit_beats_one_commit_per_put(bench_root: Path) -> None:
    r = store_bench.group_commit(bench_root)
    print(store_bench.render_group_commit(r))
    assert r["speedup"] >= store_bench.TARGETS["group_commit_speedup"][1], (
        f"group commit is {r['speedup']:.2f}x one commit per put"
        f" (flush latency of this disk: p50 {r['flush_latency_us']['p50']:.0f} us)"
    )


def test_cold_hydration_at_the_longest_chain(bench_root: Path, trajectory_dir: str | None) -> None:
    r = store_bench.cold_hydration(bench_root, trajectory_dir)
    print(store_bench.render_cold_hydration(r))
    assert r["rows"] and r["byte_exact"], [(row["mode"], row["chain"], row["byte_exact"]) for row in r["rows"]]


def test_scale_latency_and_disk_bytes(bench_root: Path) -> None:
    sessions = int(os.environ.get(store_bench.ENV_SESSIONS) or store_bench.DEFAULT_SESSIONS)
    r = store_bench.scale(bench_root, sessions)
    print(store_bench.render_scale(r))
    assert all(p["mismatches"] == 0 for p in r["probes"])
    missed = {
        name: c
        for name, c in {
            "p99_growth_latest": store_bench.check("p99_growth_latest", r["p99_growth_latest"]),
            "p99_growth_old_version": store_bench.check("p99_growth_old_version", r["p99_growth_old_version"]),
            "data_file_vs_frames": store_bench.check("data_file_vs_frames", r["disk"][-1]["file_vs_frames"]),
        }.items()
        if not c["ok"]
    }
    assert not missed, f"targets missed: {missed}"


def test_merge_cost_does_not_grow_with_the_state(bench_root: Path) -> None:
    r = store_bench.merge_cost(bench_root)
    print(store_bench.render_merge_cost(r))
    c = store_bench.check("merge_cost_growth", r["growth"])
    assert c["ok"], f"a merge onto a 1 MB head costs {r['growth']:.2f}x one onto a 10 KB head (target {c['target']})"


def test_quiet_keyframes_read_back_exact(bench_root: Path, trajectory_dir: str | None) -> None:
    r = store_bench.quiet_keyframes(bench_root, trajectory_dir)
    print(store_bench.render_quiet_keyframes(r))
    for mode, m in r["modes"].items():
        assert m["mismatches"] == 0 and m["keyframes_written"] > 0, (mode, m)
