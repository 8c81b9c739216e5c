"""A server's CPU is read before the benchmark's writers run, not once they hold the interpreter lock: read
after, a short run could end before the read (its server CPU counted as none)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from ckpt.bench import langgraph_bench, sidecar_load
from ckpt.bench.langgraph_replay import Put, PutWrites, ThreadRecord
from ckpt.bench.langgraph_systems import SaverSystem

#: How long a first read waits for a writer to start: one that starts in this time ran before it.
_WAIT_SECONDS = 0.5


class _Saver:
    def __init__(self, started: threading.Event) -> None:
        self.started = started
        self.last = ""

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> None:
        self.started.set()
        self.last = checkpoint["id"]

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str) -> None:
        return None

    def get_tuple(self, config: Any) -> Any:
        return type("Tuple", (), {"config": {"configurable": {"checkpoint_id": self.last}}})()


class _System(SaverSystem):
    name = "fake"
    label = "fake"

    def __init__(self, started: threading.Event) -> None:
        self.started = started

    def open(self, directory: Path) -> None:
        return None

    def saver(self) -> Any:
        return _Saver(self.started)

    def close(self) -> None:
        return None

    def footprint(self) -> dict[str, Any]:
        return {}

    def server_pid(self) -> int | None:
        return 1


def _first_read_sees_no_writer(started: threading.Event, reads: list[bool]) -> float:
    if not reads:
        reads.append(not started.wait(_WAIT_SECONDS))
    return 1.0


def test_the_savers_benchmark_reads_the_server_cpu_before_its_writers_start(monkeypatch: pytest.MonkeyPatch) -> None:
    started, reads = threading.Event(), list[bool]()
    monkeypatch.setattr(langgraph_bench, "tree_cpu_seconds", lambda pid: _first_read_sees_no_writer(started, reads))
    config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    written: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "c1"}}
    record = ThreadRecord("t", (Put(config, {"id": "c1"}, {}, {}), PutWrites(written, (), "task", "")), 1)  # type: ignore[typeddict-item]
    out = langgraph_bench.run_writers(_System(started), [[record], [record]])
    assert reads == [True]
    assert out["put_calls"] == 2 and out["server_cpu_us_per_put"] == 0.0


def test_the_sidecar_load_reads_the_server_cpu_before_its_workers_start(monkeypatch: pytest.MonkeyPatch) -> None:
    started, reads = threading.Event(), list[bool]()
    monkeypatch.setattr(sidecar_load, "cpu_seconds", lambda pids: _first_read_sees_no_writer(started, reads))

    def worker(stop: threading.Event) -> int:
        started.set()
        return 1

    out = sidecar_load.run_threads([worker, worker], 0.0, [1])
    assert reads == [True]
    assert out.calls == 2
