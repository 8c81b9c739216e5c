"""The benchmarks' readings of several server processes: merges reach every worker, CPU counts them all.

bench.workers_bench is the measurement behind docs/performance.md's figures for
`--workers`, so a bench that silently sent every merge to one worker would
make them wrong.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import grpc
import pytest

from ckpt.bench import sidecar_load, workers_bench
from ckpt.bench.echo import ECHO_METHOD, LINK_ECHO_METHOD
from ckpt.bench.echo_sidecar import start_echo_sidecar
from ckpt.bench.output import child_pids, proc_cpu_seconds
from ckpt.sidecar.client import AsyncCheckpointClient
from ckpt.sidecar.server import start_sidecar_process


def test_the_workers_bench_spreads_merges_over_every_worker_and_counts_their_cpu(tmp_path: Path) -> None:
    sidecar = workers_bench._start(tmp_path, "workers", 2)
    target = workers_bench.Target(sidecar, workers=2, quick=True)
    try:
        assert len(target.workers) == 2
        # The parent, its workers and each worker's store process: all the server's CPU.
        assert target.pids[0] == sidecar.pid and len(target.pids) == 5 and set(target.workers) < set(target.pids)
        with grpc.insecure_channel(sidecar.targets[0]) as channel:  # every worker serves the echo extension
            for method in (ECHO_METHOD, LINK_ECHO_METHOD):
                assert channel.unary_unary(method)(b"w", timeout=10) == b"w"
        bench = target.bench
        bench.seed()
        cpu_before = [proc_cpu_seconds(p) for p in target.workers]
        t = sidecar_load.run_threads(bench.merge_workers(), 0.5, target.pids)
        cpu_after = [proc_cpu_seconds(p) for p in target.workers]
        assert t.calls > 0 and math.isfinite(t.server_cpu_us_per_call)
        # Both workers served merges: the clients' connections did not all land on one. Judged by each
        # worker's share of the two's CPU (read in 10 ms ticks), not by a number of seconds: on a loaded
        # machine a worker serving its half spent 0.05 s in the 0.5 s; an idle one spends a tick at most.
        # The kernel spreads the 16 connections at random: one worker gets at most 1 of them 1 time in 2,000.
        used = []
        for before, after in zip(cpu_before, cpu_after, strict=True):
            assert before is not None and after is not None
            used.append(after - before)
        assert min(used) >= 0.02 and min(used) > 0.05 * sum(used), used
        heads = [bench.client.get(f"bench-merge-{i:03d}").version for i in range(sidecar_load.CLIENTS)]
        assert sum(h - 1 for h in heads) == t.calls  # every merge counted landed once
    finally:
        target.close()
        assert sidecar.stop() == 0, sidecar.log(tail_chars=2000)


def test_cpu_seconds_sums_the_processes_and_is_nan_for_a_missing_one(tmp_path: Path) -> None:
    sidecar = start_echo_sidecar(tmp_path, "one")
    try:
        one = sidecar_load.cpu_seconds([sidecar.pid])
        assert one > 0
        assert sidecar_load.cpu_seconds([sidecar.pid, sidecar.pid]) >= 2 * one
    finally:
        assert sidecar.stop() == 0
    assert math.isnan(sidecar_load.cpu_seconds([sidecar.pid]))  # reaped: no /proc entry left


def test_the_echo_is_answered_by_the_grpc_process_and_the_link_echo_by_the_store_process(tmp_path: Path) -> None:
    payload = bytes(range(256)) * 40
    sidecar = start_echo_sidecar(tmp_path, "linked")
    try:
        with grpc.insecure_channel(sidecar.targets[0]) as channel:
            assert channel.unary_unary(ECHO_METHOD)(payload, timeout=10) == payload
            assert channel.unary_unary(LINK_ECHO_METHOD)(payload, timeout=10) == payload
            assert channel.unary_unary(LINK_ECHO_METHOD)(b"", timeout=10) == b""
        # The bench measures it, and splits the ratio with it. Each reading of the link echo spends the
        # store process's CPU: the bytes cross to it and back.
        bench = sidecar_load.Bench(sidecar, quick=True)
        try:
            (store_process,) = child_pids(sidecar.pid)
            before = proc_cpu_seconds(store_process)
            t = sidecar_load.run_threads(
                bench.echo_workers(bench.echo_request_size, through_store=True), 0.3, [sidecar.pid]
            )
            assert t.calls > 0
            after = proc_cpu_seconds(store_process)
            assert before is not None and after is not None and after > before
        finally:
            bench.close()
    finally:
        assert sidecar.stop() == 0, sidecar.log(tail_chars=2000)


def test_a_sidecar_started_without_the_launcher_serves_no_echo(tmp_path: Path) -> None:
    sidecar = start_sidecar_process(tmp_path / "plain", listen=[f"unix:{tmp_path / 'plain.sock'}"])
    try:
        with grpc.insecure_channel(sidecar.targets[0]) as channel:
            for method in (ECHO_METHOD, LINK_ECHO_METHOD):
                with pytest.raises(grpc.RpcError) as info:
                    channel.unary_unary(method)(b"x", timeout=10)
                assert info.value.code() is grpc.StatusCode.UNIMPLEMENTED
    finally:
        assert sidecar.stop() == 0, sidecar.log(tail_chars=2000)


def test_the_asyncio_reading_counts_each_merge_it_makes_once(tmp_path: Path) -> None:
    """The judged unary merge rate is 64 asyncio tasks' (bench.sidecar_load.run_tasks): every merge they
    count landed, once, and the echo reading by the same load generator returns the bytes it sent."""
    sidecar = start_echo_sidecar(tmp_path, "tasks")
    try:
        bench = sidecar_load.Bench(sidecar, quick=True)
        try:
            bench.seed()
            sessions = [f"bench-merge-{i:03d}" for i in range(sidecar_load.CLIENTS)]
            before = [bench.client.get(s).version for s in sessions]

            async def merges() -> sidecar_load.Throughput:
                async with AsyncCheckpointClient(sidecar.targets[0]) as client:
                    return await sidecar_load.run_tasks(bench.merge_tasks(client), 0.5, [sidecar.pid])

            t = asyncio.run(merges())
            assert t.calls > 0 and math.isfinite(t.server_cpu_us_per_call) and t.client_cpu_us_per_call > 0
            after = [bench.client.get(s).version for s in sessions]
            assert sum(a - b for a, b in zip(after, before, strict=True)) == t.calls
            assert all(a > b for a, b in zip(after, before, strict=True))  # every task merged
            echo = bench.measure_tasks("echo", seeded=False, pids=[sidecar.pid])
            assert echo.calls > 0 and echo.rate > 0
        finally:
            bench.close()
    finally:
        assert sidecar.stop() == 0, sidecar.log(tail_chars=2000)


def test_run_tasks_stops_the_other_tasks_and_raises_when_one_fails() -> None:
    async def failing(stop: asyncio.Event) -> int:
        await asyncio.sleep(0.01)
        raise RuntimeError("the sidecar went away")

    async def looping(stop: asyncio.Event) -> int:
        n = 0
        while not stop.is_set():
            await asyncio.sleep(0.001)
            n += 1
        return n

    async def run() -> float:
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(RuntimeError, match="the sidecar went away"):
            await sidecar_load.run_tasks([failing, looping, looping], 60, [])
        return loop.time() - began

    assert asyncio.run(run()) < 10  # not the 60 s asked: the failure ended the reading
