"""What the store benchmarks share: where their stores go, the targets they check, timing and summaries."""

from __future__ import annotations

import os
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..stats import percentile

ENV_DIR = "CKPT_BENCH_DIR"
ENV_SESSIONS = "CKPT_BENCH_SESSIONS"
# The repository root, in a source checkout (ckpt/bench links to bench/, so the resolved path is the checkout's).
_CHECKOUT = Path(__file__).resolve().parents[2]
# A checkout keeps the stores at its root (git-ignored); an installed package has no checkout to hold them
# and its site-packages may not be writable, so it uses the user's cache directory.
DEFAULT_DIR = (
    _CHECKOUT / ".bench-data"
    if (_CHECKOUT / "pyproject.toml").is_file()
    else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ckpt-bench"
)
DEFAULT_SESSIONS = 1_000_000


# Targets from the store issue's acceptance: (comparison, bound).
TARGETS: dict[str, tuple[str, float]] = {
    "group_commit_speedup": (">=", 5.0),
    "p99_growth_latest": ("<=", 1.5),
    "p99_growth_old_version": ("<=", 1.5),
    "data_file_vs_frames": ("<=", 1.5),
    # DESIGN.md: a MERGE costs O(change) in CPU, not O(state).
    "merge_cost_growth": ("<=", 1.5),
}


def data_root(path: str | os.PathLike[str] | None = None) -> Path:
    """The directory holding every benchmark's LMDB environments (created)."""
    root = Path(path) if path is not None else Path(os.environ.get(ENV_DIR) or DEFAULT_DIR)
    root.mkdir(parents=True, exist_ok=True)
    return root


def fresh_dir(root: Path, name: str) -> Path:
    path = root / name
    shutil.rmtree(path, ignore_errors=True)
    return path


def damon_pageout(root: Path = Path("/sys/kernel/mm/damon/admin/kdamonds")) -> str:
    """The kernel's DAMON pageout schemes, if any: they evict page cache idle for a while."""
    found = []
    for scheme in sorted(root.glob("*/contexts/*/schemes/*")):
        try:
            if (scheme / "action").read_text().strip() != "pageout":
                continue
            kdamond = scheme.parents[3]
            if (kdamond / "state").read_text().strip() != "on":
                continue
            aggr_us = int((scheme.parents[1] / "monitoring_attrs/intervals/aggr_us").read_text())
            min_age = int((scheme / "access_pattern/age/min").read_text())
            max_acc = int((scheme / "access_pattern/nr_accesses/max").read_text())
        except (OSError, ValueError):
            continue
        found.append(f"DAMON pageout of memory idle >= {min_age * aggr_us / 1e6:g} s (nr_accesses <= {max_acc})")
    return "; ".join(found) or "none found"


def check(name: str, measured: float) -> dict[str, Any]:
    op, bound = TARGETS[name]
    ok = measured >= bound if op == ">=" else measured <= bound
    return {"measured": measured, "target": f"{op} {bound}", "ok": ok}


def interleaved(fns: list[Callable[[], object]], reps: int) -> list[float]:
    """Median seconds of each function, called in turn so machine noise hits all alike."""
    samples: list[list[int]] = [[] for _ in fns]
    for _ in range(reps):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter_ns()
            fn()
            samples[i].append(time.perf_counter_ns() - t0)
    return [statistics.median(s) / 1e9 for s in samples]


def summary(us: list[float]) -> dict[str, float]:
    return {"p50": statistics.median(us), "p99": percentile(us, 99), "p999": percentile(us, 99.9)}
