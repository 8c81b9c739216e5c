"""Sidecar benchmark (opt-in: `make bench`, or pytest -m benchmark tests/bench/).

Runs bench.sidecar_bench in full against one real `ckpt serve` subprocess (data
on real disk under $CKPT_BENCH_DIR, else .bench-data/ at the repository root),
prints its table and checks the targets of the sidecar issue's acceptance:
unary MERGE >= 0.7x the echo of the same request size, PutStream >= 3x unary
MERGE, and a hot get of a ~300 KB state within 1.5x (p50) of echoing its bytes.
"""

from __future__ import annotations

import pytest

from ckpt.bench import sidecar_bench

pytestmark = pytest.mark.benchmark


@pytest.fixture(scope="module")
def report() -> sidecar_bench.Report:
    r = sidecar_bench.run()
    print("\n" + sidecar_bench.render(r))
    return r


def test_unary_merge_vs_echo(report: sidecar_bench.Report) -> None:
    c = report.checks["unary_merge_vs_echo"]
    assert c["ok"], f"unary MERGE is {c['measured']:.2f}x the echo rate (target >= {c['target']})"


def test_stream_vs_unary_merge(report: sidecar_bench.Report) -> None:
    c = report.checks["stream_vs_unary_merge"]
    assert c["ok"], f"PutStream is {c['measured']:.2f}x unary MERGE (target >= {c['target']})"


def test_hot_get_vs_echo(report: sidecar_bench.Report) -> None:
    c = report.checks["hot_get_p50_vs_echo"]
    assert c["ok"], f"hot get p50 is {c['measured']:.2f}x the echo of its bytes (target <= {c['target']})"
