"""Quiet keyframes: agents writing in bursts, each pause's cold resume read with and without them."""

from __future__ import annotations

import contextlib
import random
import shutil
import time
from pathlib import Path
from typing import Any

from ...codec import ChainPolicy
from ...sidecar import PutRequest, Store, StoreConfig, WriteMode
from .. import trajectories
from ..harness.systems.base import same_checkpoint
from .common import fresh_dir, summary

KEYFRAMES_RELAXED = "keyframes, max_decode_cost_ratio 8"


def quiet_keyframes(
    root: Path, trajectory_dir: str | None = None, *, burst_steps: tuple[int, int] = (3, 12), seed: int = 7
) -> dict[str, Any]:
    """Agents that write in bursts and pause: the cold read that resumes each, with quiet keyframes and without.

    Every trajectory is one session, cut into bursts of ``burst_steps`` steps
    (seeded; the same cuts for every store). Each round, every session writes
    its next burst to two stores open side by side (the default config, and
    ``keyframe_after_quiet_seconds``); the second is then swept as if the
    quiet period had passed; then every session that wrote is read cold (its
    head, from LMDB: what an agent resuming after the sidecar's cache lost
    it, or after a restart, waits for), from both stores, alternating which
    goes first. REPLACE and MERGE sessions alike; every read is checked
    against the state the trajectory holds at that step (``mismatches``).
    """
    sessions = [list(trajectories.replay(t)) for t in trajectories.load(trajectory_dir)]
    rng = random.Random(seed)
    bursts: list[list[int]] = []  # per session, the step index each burst ends at (exclusive)
    for steps in sessions:
        ends, at = [], 0
        while at < len(steps):
            at = min(at + rng.randint(*burst_steps), len(steps))
            ends.append(at)
        bursts.append(ends)
    quiet_seconds = 60.0
    # The third lets chains run twice as long within a burst: the pause's keyframe ends them anyway.
    policies = {"default": None, "keyframes": None, KEYFRAMES_RELAXED: ChainPolicy(max_decode_cost_ratio=8.0)}
    names = tuple(policies)
    out: dict[str, Any] = {"sessions": len(sessions), "burst_steps": list(burst_steps), "modes": {}}
    for mode in (WriteMode.REPLACE, WriteMode.MERGE):
        dirs = {name: fresh_dir(root, f"quiet-{k}") for k, name in enumerate(names)}
        configs = {
            name: StoreConfig(
                data_dir=dirs[name],
                cache_size_bytes=0,
                sweep_interval_seconds=3600,
                keyframe_after_quiet_seconds=None if name == "default" else quiet_seconds,
                fold_after_quiet_seconds=None,  # keyframes alone, against chains (folds: their own measure)
                chain_policy=policy or ChainPolicy(),
            )
            for name, policy in policies.items()
        }
        reads_us: dict[str, list[float]] = {name: [] for name in names}
        sweep_s, keyframes, mismatches = 0.0, 0, 0
        try:
            with contextlib.ExitStack() as opened:
                stores = {name: opened.enter_context(Store(config)) for name, config in configs.items()}
                keyed = stores["keyframes"]
                starts = [0] * len(sessions)
                for r in range(max(len(b) for b in bursts)):
                    wrote = []
                    for i, steps in enumerate(sessions):
                        if r >= len(bursts[i]):
                            continue
                        chunk = steps[starts[i] : bursts[i][r]]
                        starts[i] = bursts[i][r]
                        requests = [
                            PutRequest(f"t{i:02d}", st.state if mode is WriteMode.REPLACE else st.patch, mode)
                            for st in chunk
                        ]
                        for store in stores.values():
                            store.put_many(requests)
                        wrote.append(i)
                    # 3 s past the period: beyond the 1.07 s granule of the updated-time index it scans.
                    quiet = time.time_ns() + int((quiet_seconds + 3) * 1e9)
                    t0 = time.perf_counter()
                    keyframes += keyed.sweep(now_nanos=quiet).keyframes_written
                    sweep_s += time.perf_counter() - t0
                    stores[KEYFRAMES_RELAXED].sweep(now_nanos=quiet)
                    for k, i in enumerate(wrote):
                        expected = sessions[i][starts[i] - 1].state
                        for name in names[k % 3 :] + names[: k % 3]:
                            t0 = time.perf_counter_ns()
                            got = stores[name].get(f"t{i:02d}", use_cache=False)
                            reads_us[name].append((time.perf_counter_ns() - t0) / 1e3)
                            # A MERGE head is the patches' concatenation: the same message, not the same bytes.
                            if not same_checkpoint(got.state, expected):
                                mismatches += 1
                stored = {
                    name: sum(store.session(f"t{i:02d}").stored_bytes for i in range(len(sessions)))
                    for name, store in stores.items()
                }
                versions = sum(len(s) for s in sessions)
        finally:
            for d in dirs.values():
                shutil.rmtree(d, ignore_errors=True)
        out["modes"][mode.name] = {
            "versions": versions,
            "resume_reads": len(reads_us["default"]),
            "bytes_per_version": {name: stored[name] / versions for name in names},
            "resume_read_us": {name: summary(us) for name, us in reads_us.items()},
            "keyframes_written": keyframes,
            "sweep_ms_per_keyframe": 1e3 * sweep_s / keyframes if keyframes else 0.0,
            "mismatches": mismatches,
        }
    return out


def render_quiet_keyframes(r: dict[str, Any]) -> str:
    lo, hi = r["burst_steps"]
    lines = [
        f"\n## quiet keyframes: {r['sessions']} trajectories written in bursts of {lo}-{hi} steps; after each"
        " burst the session pauses and is read back cold (stores side by side, cache off)",
        "",
        "| writes | config | bytes/version | resume read p50 (us) | p99 (us) |",
        "|---|---|---:|---:|---:|",
    ]
    for mode, m in r["modes"].items():
        for name in m["bytes_per_version"]:
            us = m["resume_read_us"][name]
            lines.append(
                f"| {mode} | {name} | {m['bytes_per_version'][name]:,.0f} | {us['p50']:.0f} | {us['p99']:.0f} |"
            )
    for mode, m in r["modes"].items():
        b, us = m["bytes_per_version"], m["resume_read_us"]
        for name in (KEYFRAMES_RELAXED, "keyframes"):
            lines.append(
                f"\n{mode}: {name} / default: bytes {b[name] / b['default']:.2f}x, resume read p50"
                f" {us[name]['p50'] / us['default']['p50']:.2f}x, p99 {us[name]['p99'] / us['default']['p99']:.2f}x"
            )
        lines.append(
            f"\n{mode}: {m['keyframes_written']:,} keyframes over {m['resume_reads']:,} pauses,"
            f" {m['sweep_ms_per_keyframe']:.2f} ms of sweep each; mismatches {m['mismatches']}"
        )
    return "\n".join(lines)
