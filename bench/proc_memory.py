"""The resident memory of a server's processes while a call runs, sampled on a thread (Linux's /proc).

From ``/proc/<pid>/status``: VmRSS, the bytes resident now (anonymous memory
plus the file pages it maps: LMDB's map, the program's libraries); RssAnon,
its anonymous part (heaps, stacks, buffers); VmHWM, the most VmRSS has been
since the process started. The kernel keeps VmHWM up to date, so a peak that
falls between two samples still shows in it, if it was the process's highest
yet.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: How often the resident memory is read while a call runs.
SAMPLE_SECONDS = 0.05

_FIELDS = ("VmRSS", "RssAnon", "VmHWM")


def memory_status(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon and VmHWM of ``pid`` in bytes (OSError if it is gone)."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in _FIELDS:
            number, unit = value.split()
            if unit != "kB":
                raise ValueError(f"/proc/{pid}/status gives {name} in {unit!r}, not kB")
            out[name] = int(number) * 1024
    missing = set(_FIELDS) - set(out)
    if missing:
        raise ValueError(f"/proc/{pid}/status has no {', '.join(sorted(missing))}")
    return out


@dataclass
class ProcessMemory:
    """One process's memory around a call, in bytes."""

    pid: int
    baseline_rss: int
    baseline_anon: int
    hwm_before: int
    peak_rss: int = 0
    peak_anon: int = 0
    hwm_after: int = 0

    def peak_growth(self) -> int:
        """The highest VmRSS seen over the baseline: sampled, or VmHWM if it rose during the call."""
        peak = max(self.peak_rss, self.hwm_after if self.hwm_after > self.hwm_before else 0)
        return peak - self.baseline_rss

    def as_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "baseline_rss_bytes": self.baseline_rss,
            "peak_rss_bytes": self.peak_rss,
            "baseline_anon_bytes": self.baseline_anon,
            "peak_anon_bytes": self.peak_anon,
            "hwm_before_bytes": self.hwm_before,
            "hwm_after_bytes": self.hwm_after,
            "hwm_rose": self.hwm_after > self.hwm_before,
            "peak_growth_bytes": self.peak_growth(),
        }


class MemorySampler:
    """``with MemorySampler({"grpc": pid, ...}) as m:`` reads each process's memory on entering (the
    baseline), every ``interval_seconds`` while the block runs, and on leaving; then :meth:`reading`."""

    def __init__(self, pids: Mapping[str, int], *, interval_seconds: float = SAMPLE_SECONDS) -> None:
        self._pids = dict(pids)
        self._interval = interval_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)
        self.processes: dict[str, ProcessMemory] = {}
        self._baseline_total = 0
        self._peak_total = 0
        self.samples = 0

    def __enter__(self) -> MemorySampler:
        for role, pid in self._pids.items():
            status = memory_status(pid)
            rss, anon = status["VmRSS"], status["RssAnon"]
            self.processes[role] = ProcessMemory(pid, rss, anon, status["VmHWM"], peak_rss=rss, peak_anon=anon)
        self._baseline_total = self._peak_total = sum(p.baseline_rss for p in self.processes.values())
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        for process in self.processes.values():
            process.hwm_after = memory_status(process.pid)["VmHWM"]

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def _sample(self) -> None:
        total = 0
        for process in self.processes.values():
            status = memory_status(process.pid)
            process.peak_rss = max(process.peak_rss, status["VmRSS"])
            process.peak_anon = max(process.peak_anon, status["RssAnon"])
            total += status["VmRSS"]
        self._peak_total = max(self._peak_total, total)
        self.samples += 1

    def reading(self) -> dict[str, Any]:
        """Each process's figures; the sampled growth of their sum (the highest sum of VmRSS read at one
        moment, over the baseline's); and its upper bound: each process's own highest (sampled, or VmHWM
        if it rose) over its baseline, summed, which counts peaks that fell between samples."""
        return {
            "samples": self.samples,
            "processes": {role: p.as_dict() for role, p in self.processes.items()},
            "sampled_growth_bytes": self._peak_total - self._baseline_total,
            "peak_growth_bytes": sum(p.peak_growth() for p in self.processes.values()),
        }
