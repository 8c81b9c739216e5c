"""Drive workloads through systems and measure them, side by side in one run.

For each workload, every system gets the same steps (converted untimed by its
``prepare``). Per system:

1. Writes, once per concurrency level (1, 8, 64 agents by default), each on a
   fresh data directory: C threads take whole sessions from a queue and write
   their steps in order, each ``put`` timed. When there are fewer sessions
   than agents, sessions are repeated under new ids so every agent has work.
   Throughput is puts over wall time; CPU is this process's CPU time plus any
   server process's (the sidecar), per put.
2. Reads, on the single-agent store (its inserts are sequential, as one agent
   writes): disk and stored bytes; hot latest reads (store still open, caches
   warm); then, per round, the store is closed and reopened (in-process
   caches dropped; the OS page cache stays warm) and each session's latest is
   read once (cold), then a random older version of each session.
3. Every value read is checked against the workload's state (untimed).

Results are flat records: one per system x workload x metric, with the
latency samples kept for the report's CDFs.
"""

from __future__ import annotations

import contextlib
import gc
import os
import queue
import random
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...codec import _zstd
from ..stats import percentile
from ..trajectories import Step
from . import systems as systems_mod
from . import workloads as workloads_mod

DEFAULT_CONCURRENCY = (1, 8, 64)
# A 20 MB state per agent x 64 agents would measure the machine's memory, not the store.
SINGLE_AGENT_WORKLOADS = frozenset({"large"})
MAX_KEPT_SAMPLES = 500  # plenty for a CDF plot; keeps results.json small enough to commit


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    workloads: tuple[str, ...]
    systems: tuple[str, ...]
    data_dir: Path
    quick: bool = False
    mode: str = "merge"
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    seed: int = 0
    sessions: int | None = None  # overrides the workload's size
    steps: int | None = None
    cold_rounds: int = 3
    hot_reads_per_session: int = 5
    trajectories_dir: Path | None = None

    def size_of(self, workload: str) -> tuple[int, int]:
        info = workloads_mod.WORKLOADS[workload]
        sessions, steps = info.quick if self.quick else info.full
        return (self.sessions or sessions, self.steps or steps)


@dataclass(slots=True)
class Results:
    records: list[dict[str, Any]] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)  # system name -> its label for the report

    def add(self, system: str, workload: str, metric: str, value: float, unit: str, **extra: Any) -> None:
        self.records.append(
            {"system": system, "workload": workload, "metric": metric, "value": value, "unit": unit, **extra}
        )


class Progress:
    """A one-line progress bar on stderr (plain lines when stderr is not a terminal)."""

    def __init__(self, total: int, *, stream: Any = None, enabled: bool = True) -> None:
        import sys

        self.total = max(total, 1)
        self.done = 0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = time.monotonic()

    def step(self, label: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        width = 30
        filled = width * self.done // self.total
        elapsed = time.monotonic() - self.started
        line = f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {elapsed:6.1f}s {label}"
        if self.tty:
            self.stream.write("\r\x1b[K" + line[:160])
            if self.done >= self.total:
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def _keep(samples: list[float]) -> list[float]:
    """Evenly thinned, rounded samples: enough for a CDF, small enough for the JSON."""
    ordered = sorted(samples)
    if len(ordered) > MAX_KEPT_SAMPLES:
        stride = len(ordered) / MAX_KEPT_SAMPLES
        ordered = [ordered[int(i * stride)] for i in range(MAX_KEPT_SAMPLES)] + [ordered[-1]]
    return [round(v, 2) for v in ordered]


def _latency_records(
    results: Results, system: str, workload: str, metric: str, samples_us: list[float], **extra: Any
) -> None:
    results.add(
        system,
        workload,
        metric,
        statistics.median(samples_us),
        "us",
        p50_us=statistics.median(samples_us),
        p99_us=percentile(samples_us, 99),
        mean_us=statistics.fmean(samples_us),
        count=len(samples_us),
        samples_us=_keep(samples_us),
        **extra,
    )


def ideal_bytes(sessions: Iterable[Sequence[Step]], *, level: int = 3) -> int:
    """Sum over steps of zstd at ``level`` of that step's patch alone (the ideal a delta store approaches)."""
    return sum(len(_zstd.zstd.compress(step.patch, level)) for steps in sessions for step in steps)


def _write_phase(
    system: systems_mod.System, sessions: list[tuple[str, list[Any]]], agents: int
) -> tuple[float, list[float], float]:
    """Write every session with ``agents`` threads; returns (wall seconds, put latencies us, cpu seconds)."""
    work: queue.SimpleQueue[tuple[str, list[Any]] | None] = queue.SimpleQueue()
    for item in sessions:
        work.put(item)
    for _ in range(agents):
        work.put(None)
    latencies: list[list[float]] = [[] for _ in range(agents)]
    errors: list[BaseException] = []
    start_gate = threading.Barrier(agents + 1)

    def agent(index: int) -> None:
        mine = latencies[index]
        clock = time.perf_counter_ns
        start_gate.wait()
        try:
            while (item := work.get()) is not None:
                sid, values = item
                for version, value in enumerate(values, start=1):
                    t0 = clock()
                    system.put(sid, version, value)
                    mine.append((clock() - t0) / 1000)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=agent, args=(i,), name=f"agent-{i}") for i in range(agents)]
    for t in threads:
        t.start()
    gc.collect()
    cpu0, server0 = time.process_time(), system.server_cpu_seconds()
    start_gate.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0 + system.server_cpu_seconds() - server0
    if errors:
        raise RuntimeError(f"{system.name}: a write failed with {agents} agents") from errors[0]
    return wall, [v for part in latencies for v in part], cpu


def _timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    t0 = time.perf_counter_ns()
    value = fn(*args)
    return value, (time.perf_counter_ns() - t0) / 1000


def _check(system: systems_mod.System, got: Any, step: Step, what: str) -> None:
    if not system.matches(got, step):
        raise AssertionError(f"{system.name} returned a wrong state for {what}")


def measure_system(
    results: Results,
    config: RunConfig,
    workload: str,
    steps_by_session: list[list[Step]],
    system_name: str,
    *,
    progress: Progress | None = None,
) -> None:
    """Run one system through one workload (writes at each concurrency, then reads) and record the figures."""
    rng = random.Random(config.seed)
    system = systems_mod.make(system_name, mode=config.mode)
    name = system.name
    results.labels[name] = system.label
    values = [[system.prepare(step) for step in steps] for steps in steps_by_session]
    levels = (1,) if workload in SINGLE_AGENT_WORKLOADS else tuple(config.concurrency)
    # The single-agent run is written last and kept open for the reads.
    order = sorted(levels, reverse=True)
    base = config.data_dir / f"{workload}-{name}"
    kept_dir: Path | None = None
    for agents in order:
        data_dir = base / f"c{agents}"
        shutil.rmtree(data_dir, ignore_errors=True)
        data_dir.mkdir(parents=True)
        count = max(len(values), agents)
        sessions = [(f"{workload}-{i:06d}", values[i % len(values)]) for i in range(count)]
        system.open(data_dir)
        wall, lat, cpu = _write_phase(system, sessions, agents)
        puts = len(lat)
        results.add(name, workload, "write_throughput", puts / wall, "puts/s", agents=agents, puts=puts)
        _latency_records(results, name, workload, "write_latency", lat, agents=agents)
        results.add(name, workload, "cpu_per_checkpoint", cpu / puts * 1e6, "us", agents=agents)
        if agents != order[-1]:
            system.close()
            shutil.rmtree(data_dir, ignore_errors=True)
        else:
            kept_dir = data_dir
        if progress:
            progress.step(f"{workload} {name} write x{agents}")
    assert kept_dir is not None
    # `sessions` is what the kept (single-agent) run wrote.
    sessions_written = [(sid, i) for i, (sid, _) in enumerate(sessions)]
    total_checkpoints = sum(len(session_values) for _, session_values in sessions)
    try:
        stored = system.stored_bytes()
        if system.persistent:  # an in-memory saver has no disk to report
            disk = system.disk_bytes()
            results.add(name, workload, "disk_bytes", disk, "B", checkpoints=total_checkpoints)
            results.add(name, workload, "disk_bytes_per_checkpoint", disk / total_checkpoints, "B")
        if stored is not None:
            results.add(name, workload, "stored_bytes_per_checkpoint", stored / total_checkpoints, "B")

        def last_step(i: int) -> Step:
            return steps_by_session[i % len(values)][-1]

        hot: list[float] = []
        for _ in range(config.hot_reads_per_session):
            for sid, i in sessions_written:
                got, us = _timed(system.get, sid)
                hot.append(us)
                _check(system, got, last_step(i), f"{sid} latest (hot)")
        _latency_records(results, name, workload, "hydrate_latest_hot", hot)

        if system.persistent:
            cold: list[float] = []
            old: list[float] = []
            for _ in range(config.cold_rounds):
                system.reopen()
                gc.collect()
                for sid, i in sessions_written:
                    got, us = _timed(system.get, sid)
                    cold.append(us)
                    _check(system, got, last_step(i), f"{sid} latest (cold)")
                for sid, i in sessions_written:
                    steps = steps_by_session[i % len(values)]
                    if len(steps) < 2:
                        continue
                    version = rng.randrange(1, len(steps))
                    got, us = _timed(system.get, sid, version)
                    old.append(us)
                    _check(system, got, steps[version - 1], f"{sid} v{version} (cold)")
            _latency_records(results, name, workload, "hydrate_latest_cold", cold)
            if old:
                _latency_records(results, name, workload, "hydrate_old_cold", old)
    finally:
        system.close()
        shutil.rmtree(base, ignore_errors=True)
    if progress:
        progress.step(f"{workload} {name} reads")


def run(config: RunConfig, *, progress: bool = True) -> dict[str, Any]:
    """Every workload x system of the config; returns the results document (see ``report``)."""
    for w in config.workloads:
        if w not in workloads_mod.WORKLOADS:
            raise ValueError(f"unknown workload {w!r}; known: {', '.join(workloads_mod.WORKLOADS)}")
    for s in config.systems:
        if s not in systems_mod.SYSTEMS:
            raise ValueError(f"unknown system {s!r}; known: {', '.join(systems_mod.SYSTEMS)}")
    results = Results()
    started = time.time()
    steps_total = sum(
        len(config.systems) * ((1 if w in SINGLE_AGENT_WORKLOADS else len(config.concurrency)) + 1)
        for w in config.workloads
    )
    bar = Progress(steps_total, enabled=progress)
    workload_meta: dict[str, Any] = {}
    for workload in config.workloads:
        sessions, steps = config.size_of(workload)
        steps_by_session = workloads_mod.generate(
            workload, sessions=sessions, steps=steps, seed=config.seed, trajectories_dir=config.trajectories_dir
        )
        states = [len(s.state) for ss in steps_by_session for s in ss]
        patches = [len(s.patch) for ss in steps_by_session for s in ss]
        ideal = ideal_bytes(steps_by_session)
        workload_meta[workload] = {
            "description": workloads_mod.WORKLOADS[workload].description,
            "sessions": len(steps_by_session),
            "checkpoints": len(states),
            "mean_state_bytes": statistics.fmean(states),
            "max_state_bytes": max(states),
            "mean_patch_bytes": statistics.fmean(patches),
            "ideal_bytes_per_checkpoint": ideal / len(states),
        }
        for system in config.systems:
            measure_system(results, config, workload, steps_by_session, system, progress=bar)
        del steps_by_session
        gc.collect()
    return {
        "schema": 1,
        "started_unix": started,
        "duration_seconds": time.time() - started,
        "config": {
            "workloads": list(config.workloads),
            "systems": list(config.systems),
            "quick": config.quick,
            "mode": config.mode,
            "concurrency": list(config.concurrency),
            "seed": config.seed,
            "cold_rounds": config.cold_rounds,
        },
        "machine": machine_info(config.data_dir),
        "workloads": workload_meta,
        "system_labels": results.labels,
        "records": results.records,
    }


def machine_info(data_dir: Path) -> dict[str, Any]:
    import platform
    from importlib import metadata

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = None
    with contextlib.suppress(ValueError, OSError):
        mem_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3, 1)
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": mem_gib,
        "data_dir_fs": _filesystem_of(data_dir),
        "libzstd": _zstd.zstd.zstd_version,
        # ckpt is distributed as ckpt-sidecar ("ckpt" on PyPI is another project); reported as ckpt.
        "versions": {
            name: version("ckpt-sidecar" if name == "ckpt" else name)
            for name in (
                "ckpt",
                "grpcio",
                "protobuf",
                "lmdb",
                "backports.zstd",
                "langgraph-checkpoint",
                "langgraph-checkpoint-sqlite",
            )
        },
    }


def _filesystem_of(path: Path) -> str:
    """The filesystem type under ``path`` (from /proc/mounts), since fsync costs depend on it."""
    try:
        target = path.resolve()
        best = ("", "unknown")
        with open("/proc/mounts") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 3 and str(target).startswith(parts[1]) and len(parts[1]) > len(best[0]):
                    best = (parts[1], parts[2])
        return best[1]
    except OSError:
        return "unknown"
