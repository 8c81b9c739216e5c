"""Merge cost: store time per small MERGE onto heads of 10 KB, 100 KB and 1 MB, stores side by side."""

from __future__ import annotations

import gc
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from ...sidecar import PutRequest, PutResult, Store, StoreConfig, WriteMode
from ..checkpoint_states import make_patches, make_state
from .common import TARGETS, fresh_dir


def merge_cost(
    root: Path,
    *,
    state_sizes: tuple[int, ...] = (10_000, 100_000, 1_000_000),
    sessions: int = 64,
    merges_per_round: int = 10,
    rounds: int = 7,
) -> dict[str, Any]:
    """Store time per MERGE of a ~300 B patch onto heads of each size, stores side by side.

    One store per state size, all open at once; each round, each store in turn
    takes ``put_many`` of ``merges_per_round`` merges to each of ``sessions``
    sessions (with request ids, fsync on, so they share group commits). The
    first round warms up and is dropped.
    """
    patches = make_patches(256)
    stores = {size: Store(StoreConfig(data_dir=fresh_dir(root, f"merge-cost-{size}"))) for size in state_sizes}
    samples: dict[int, list[float]] = {size: [] for size in state_sizes}
    try:
        for size, store in stores.items():
            base = make_state(size)
            store.put_many([PutRequest(session_id=f"m{i:03d}", state=base) for i in range(sessions)])
        for r in range(rounds):
            order = list(stores) if r % 2 == 0 else list(reversed(stores))
            for size in order:
                requests = [
                    PutRequest(
                        session_id=f"m{i:03d}",
                        state=patches[(r * merges_per_round + j) % len(patches)],
                        mode=WriteMode.MERGE,
                        request_id=f"r{r}-{j}-{i}",
                    )
                    for j in range(merges_per_round)
                    for i in range(sessions)
                ]
                gc.collect()
                t0 = time.perf_counter_ns()
                results = stores[size].put_many(requests)
                elapsed = time.perf_counter_ns() - t0
                if any(not isinstance(x, PutResult) for x in results):
                    raise AssertionError(f"a merge failed: {next(x for x in results if not isinstance(x, PutResult))}")
                if r:
                    samples[size].append(elapsed / 1e3 / len(requests))
        head_sizes = {size: len(store.get("m000").state) for size, store in stores.items()}
        # Evicted encoders would turn the merges into chain reads: say how many stayed cached.
        encoders = {size: store.stats() for size, store in stores.items()}
    finally:
        for size, store in stores.items():
            store.close()
            shutil.rmtree(root / f"merge-cost-{size}", ignore_errors=True)
    us = {size: statistics.median(s) for size, s in samples.items()}
    smallest, largest = min(state_sizes), max(state_sizes)
    return {
        "sessions": sessions,
        "merges_per_round": merges_per_round,
        "rounds": rounds - 1,
        "patch_bytes": statistics.median(len(p) for p in patches),
        "rows": [
            {
                "state_bytes": size,
                "final_state_bytes": head_sizes[size],
                "us_per_merge": us[size],
                "rounds": samples[size],
                "encoders_cached": encoders[size]["encoders_cached"],
                "encoder_cache_bytes": encoders[size]["encoder_cache_bytes"],
            }
            for size in state_sizes
        ],
        "growth": us[largest] / us[smallest],
    }


def render_merge_cost(r: dict[str, Any]) -> str:
    rows = r["rows"]
    lines = [
        f"\n## merge cost against state size: {r['sessions']} sessions x {r['merges_per_round']} MERGEs of"
        f" ~{r['patch_bytes']:.0f} B per round (put_many, request ids, fsync on), median of {r['rounds']} rounds,"
        " stores alternating",
        "",
        "| head state | us per merge | rounds (us) | encoders cached at the end (estimated MiB) |",
        "|---:|---:|---|---:|",
    ]
    for row in rows:
        rounds = ", ".join(f"{x:.1f}" for x in row["rounds"])
        size = f"{row['state_bytes']:,} -> {row['final_state_bytes']:,} B"
        cached = f"{row['encoders_cached']} ({row['encoder_cache_bytes'] / 2**20:.0f})"
        lines.append(f"| {size} | {row['us_per_merge']:.1f} | {rounds} | {cached} |")
    lines.append(
        f"\nlargest / smallest: **{r['growth']:.2f}x** (target {' '.join(map(str, TARGETS['merge_cost_growth']))})"
    )
    return "\n".join(lines)
