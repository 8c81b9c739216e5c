"""Tuning sweeps: stored bytes per version against cold hydrate latency.

Each point is one configuration of the embedded store (a zstd level, a chain
policy's ``max_decode_cost_ratio`` / ``max_depth``, or compaction of MERGE
states as ``ckpt.v1.Checkpoint``) fed the same sessions in
MERGE mode, one session after another. Then the store is reopened with its
state cache off and every session's latest version, and a random older one,
is read cold (LMDB read transaction + chain decode; OS page cache warm).
Bytes are the frames the store holds (headers included), per version.

Durability does not change bytes or reads, so the sweep writes with
``Durability.NO_META_SYNC`` and big batches to stay quick.
"""

from __future__ import annotations

import dataclasses
import random
import shutil
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...codec import ChainPolicy
from ...sidecar import Durability, PutRequest, Store, StoreConfig, WriteMode
from ..stats import percentile
from ..trajectories import Step
from .systems import same_checkpoint

DEFAULT = ChainPolicy()


@dataclass(frozen=True, slots=True)
class Point:
    knob: str  # "level", "max_decode_cost_ratio", "max_depth" or "merge_message_type"
    value: float
    policy: ChainPolicy
    #: StoreConfig.merge_message_type (compaction of MERGE states); the
    #: "merge_message_type" point sets it, with value 1.
    merge_message_type: str | None = None

    @property
    def is_default(self) -> bool:
        return self.policy == DEFAULT and self.merge_message_type is None

    @property
    def label(self) -> str:
        return self.merge_message_type or f"{self.value:g}"


def points(*, quick: bool) -> list[Point]:
    levels = (1, 3, 9) if quick else (1, 3, 6, 9, 15)
    ratios = (2.0, 4.0, 8.0) if quick else (1.5, 2.0, 3.0, 4.0, 6.0, 8.0)
    depths = (16, 64) if quick else (8, 16, 32, 64, 128)
    out = [Point("level", lv, dataclasses.replace(DEFAULT, level=lv)) for lv in levels]
    out += [Point("max_decode_cost_ratio", r, dataclasses.replace(DEFAULT, max_decode_cost_ratio=r)) for r in ratios]
    out += [Point("max_depth", d, dataclasses.replace(DEFAULT, max_depth=d)) for d in depths]
    out.append(Point("merge_message_type", 1, DEFAULT, merge_message_type="ckpt.v1.Checkpoint"))
    return out


def measure_point(point: Point, sessions: Sequence[Sequence[Step]], data_dir: Path, *, seed: int = 0) -> dict[str, Any]:
    shutil.rmtree(data_dir, ignore_errors=True)
    config = StoreConfig(
        data_dir=data_dir,
        durability=Durability.NO_META_SYNC,
        chain_policy=point.policy,
        merge_message_type=point.merge_message_type,
    )
    ids = [f"tune-{i:05d}" for i in range(len(sessions))]
    t0 = time.process_time()
    with Store(config) as store:
        requests = [
            PutRequest(sid, step.patch, WriteMode.MERGE)
            for sid, steps in zip(ids, sessions, strict=True)
            for step in steps
        ]
        for r in store.put_many(requests):
            if isinstance(r, Exception):
                raise r
        stored = sum(store.session(sid).stored_bytes for sid in ids)
    write_cpu = time.process_time() - t0
    versions = sum(len(s) for s in sessions)
    rng = random.Random(seed)
    latest: list[float] = []
    old: list[float] = []
    with Store(dataclasses.replace(config, cache_size_bytes=0)) as store:
        for _ in range(3):
            for sid, steps in zip(ids, sessions, strict=True):
                t = time.perf_counter_ns()
                got = store.get(sid)
                latest.append((time.perf_counter_ns() - t) / 1000)
                if not same_checkpoint(got.state, steps[-1].state):
                    raise AssertionError(f"tuning point {point.knob}={point.value}: {sid} latest differs")
                if len(steps) > 1:
                    version = rng.randrange(1, len(steps))
                    t = time.perf_counter_ns()
                    got = store.get(sid, version)
                    old.append((time.perf_counter_ns() - t) / 1000)
                    if not same_checkpoint(got.state, steps[version - 1].state):
                        raise AssertionError(f"tuning point {point.knob}={point.value}: {sid} v{version} differs")
    shutil.rmtree(data_dir, ignore_errors=True)
    return {
        "knob": point.knob,
        "value": point.value,
        "label": point.label,
        "default": point.is_default,
        "bytes_per_version": stored / versions,
        "write_cpu_us_per_version": write_cpu / versions * 1e6,
        "cold_latest_p50_us": statistics.median(latest),
        "cold_latest_p99_us": percentile(latest, 99),
        "cold_old_p50_us": statistics.median(old) if old else None,
        "cold_old_p99_us": percentile(old, 99) if old else None,
    }


def sweep(
    sessions: Sequence[Sequence[Step]], data_dir: Path, *, quick: bool, seed: int = 0, progress: Any = None
) -> list[dict[str, Any]]:
    out = []
    for point in points(quick=quick):
        out.append(measure_point(point, sessions, data_dir / "tuning", seed=seed))
        if progress is not None:
            progress.step(f"tuning {point.knob}={point.label}")
    return out
