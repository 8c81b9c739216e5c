"""Sidecar benchmark: a real `ckpt serve` process, measured against its own echo method.

    python -m bench.sidecar_bench [--quick] [--json FILE] [--no-store-process]

One sidecar subprocess is started with ``--bench-echo`` (fsync on: the default
``sync`` durability), its data directory on real disk under
``$CKPT_BENCH_DIR``, else ``.bench-data/`` at the repository root
(git-ignored), as ``sidecar-<pid>``; it is removed when done. No CKPT_*
variable of the caller's environment reaches it: its defaults are measured. Every figure is
measured against that one server, over its unix socket, in this run:

1. echo ceiling: 64 client threads calling ``/ckpt.bench.Echo/Echo`` (raw
   bytes, no (de)serialization on either side) with ~10 KB payloads, and again
   with payloads as large as a serialized merge request (the apples-to-apples
   ceiling for a merge: same bytes per call in, same number of RPCs), that one
   also from 64 asyncio tasks on one event loop (a grpc.aio channel);
2. unary MERGE: 64 threads, each owning a session seeded with a REPLACE of a
   ~10 KB Checkpoint state, calling ``CheckpointClient.merge`` with ~300 B
   patches (``step`` + one appended message), and the same from 64 asyncio
   tasks calling ``AsyncCheckpointClient.merge``; merges/s, and their ratios to
   the echoes. The target is judged on the tasks' merges against the higher of
   the two load generators' echo rates: 64 threads in one process queue for
   its GIL one behind another when a group commit answers their merges
   together (4.9 voluntary context switches a merge against 2.4 an echo call,
   measured), a wait the echo's one-by-one replies do not meet; the threads'
   own pairing is printed beside it. Sessions are re-seeded before every repetition, so each
   repetition starts from ~10 KB states (the largest state reached is printed).
   Also, for information: unary REPLACE of ~10 KB states, and (with the
   store in its own process, the default) the merge-size echo sent on by
   way of the store process, which answers it unread: what the hop alone
   costs, so a merge's gap to the echo splits into the hop and the store's work.
3. PutStream: the same merges through ``CheckpointClient.put_stream`` from 4
   threads, each with its own stream over 16 of the sessions, 128 puts per
   batch, at most 4 batches unanswered per stream; writes/s and its ratio to
   the higher of the two unary merge rates;
4. hot get: ``get`` of the latest version of a ~300 KB state (served from the
   gRPC process's reply cache, or with ``--no-store-process`` from the state
   cache) against echoing the same number of bytes, calls
   alternating on one client thread; p50/p99 of each, and the p50 ratio;
What ``ckpt serve --workers N`` changes is measured by ``python -m bench.workers_bench``.

Throughputs are medians of 3 repetitions, each preceded by a warm-up of the
same kind, with the kinds interleaved round by round (echo, merge, stream,
...) so machine noise hits all of them alike. Client and server share this
machine's cores, so the CPU time each side spends per call is recorded too.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import shutil
import signal
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from ckpt.v1 import service_pb2

from ..sidecar.client import AsyncCheckpointClient, CheckpointClient
from ..sidecar.server import ECHO_METHOD, LINK_ECHO_METHOD, SidecarProcess, event_loop_factory, start_sidecar_process
from .checkpoint_states import make_patches, make_state
from .output import finish, proc_cpu_seconds, process_and_children
from .stats import percentile

ENV_DIR = "CKPT_BENCH_DIR"
DEFAULT_DIR = Path(__file__).resolve().parent.parent / ".bench-data"

CLIENTS = 64
STREAMS = 4
STREAM_BATCH = 128
STREAM_WINDOW = 4 * STREAM_BATCH  # writes a stream may have unanswered: without a bound it runs seconds ahead
STATE_BYTES = 10_000
HOT_STATE_BYTES = 300_000
REPS = 3

# Targets from the sidecar issue's acceptance: (comparison, bound).
TARGETS: dict[str, tuple[str, float]] = {
    "unary_merge_vs_echo": (">=", 0.7),
    "stream_vs_unary_merge": (">=", 3.0),
    "hot_get_p50_vs_echo": ("<=", 1.5),
}


def data_root() -> Path:
    return Path(os.environ.get(ENV_DIR) or DEFAULT_DIR)


# -- workload ------------------------------------------------------------------


def merge_request_bytes(patch: bytes) -> int:
    """Size on the wire of the PutRequest a CheckpointClient.merge sends for ``patch``."""
    req = service_pb2.PutRequest(
        session_id=_merge_session(CLIENTS - 1), state=patch, mode=service_pb2.WRITE_MODE_MERGE, request_id="f" * 32
    )
    return req.ByteSize()


def _merge_session(i: int) -> str:
    return f"bench-merge-{i:03d}"


def _replace_session(i: int) -> str:
    return f"bench-replace-{i:03d}"


# -- measurement helpers -----------------------------------------------------------


def _cpu_seconds(pids: Sequence[int]) -> float:
    """utime + stime of the server processes; NaN without /proc (not Linux)."""
    total = 0.0
    for pid in pids:
        seconds = proc_cpu_seconds(pid)
        if seconds is None:
            return float("nan")
        total += seconds
    return total


@dataclass
class Throughput:
    calls: int
    seconds: float
    server_cpu_us_per_call: float
    client_cpu_us_per_call: float

    @property
    def rate(self) -> float:
        return self.calls / self.seconds


def run_threads(
    workers: list[Callable[[threading.Event], int]], seconds: float, server_pids: Sequence[int]
) -> Throughput:
    """Run every worker on its own thread until ``seconds`` pass; count the calls they complete.

    Workers stop at their next call boundary once the event is set; the calls in
    flight at that moment are counted and the clock runs until the last returns.
    """
    stop = threading.Event()
    start = threading.Barrier(len(workers) + 1)
    counts = [0] * len(workers)
    errors: list[BaseException] = []

    def body(i: int) -> None:
        start.wait()
        try:
            counts[i] = workers[i](stop)
        except BaseException as exc:
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(len(workers))]
    for t in threads:
        t.start()
    gc.collect()
    gc.disable()
    try:
        start.wait()
        t0 = time.perf_counter_ns()
        c0, s0 = time.process_time(), _cpu_seconds(server_pids)
        stop.wait(seconds)
        stop.set()
        for t in threads:
            t.join()
        elapsed = (time.perf_counter_ns() - t0) / 1e9
        c1, s1 = time.process_time(), _cpu_seconds(server_pids)
    finally:
        gc.enable()
    if errors:
        raise errors[0]
    calls = sum(counts)
    return Throughput(calls, elapsed, (s1 - s0) / calls * 1e6, (c1 - c0) / calls * 1e6)


#: One asyncio client task: run until the event is set, return the calls it made.
TaskWorker = Callable[[asyncio.Event], Awaitable[int]]


async def run_tasks(workers: list[TaskWorker], seconds: float, server_pids: Sequence[int]) -> Throughput:
    """:func:`run_threads` for asyncio: every worker a task on the running loop, counted the same way."""
    stop = asyncio.Event()

    async def body(work: TaskWorker) -> int:
        try:
            return await work(stop)
        except BaseException:
            stop.set()
            raise

    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        c0, s0 = time.process_time(), _cpu_seconds(server_pids)
        tasks = [asyncio.ensure_future(body(work)) for work in workers]
        await asyncio.wait([asyncio.ensure_future(stop.wait())], timeout=seconds)
        stop.set()
        counts = await asyncio.gather(*tasks, return_exceptions=True)
        elapsed = (time.perf_counter_ns() - t0) / 1e9
        c1, s1 = time.process_time(), _cpu_seconds(server_pids)
    finally:
        gc.enable()
    calls = 0
    for count in counts:
        if isinstance(count, BaseException):
            raise count
        calls += count
    return Throughput(calls, elapsed, (s1 - s0) / calls * 1e6, (c1 - c0) / calls * 1e6)


# -- the benchmark ------------------------------------------------------------------


@dataclass
class Report:
    machine: dict[str, Any]
    params: dict[str, Any]
    throughput: dict[str, dict[str, Any]] = field(default_factory=dict)
    latency: dict[str, Any] = field(default_factory=dict)
    ratios: dict[str, float] = field(default_factory=dict)
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)


class Bench:
    def __init__(self, sidecar: SidecarProcess, *, quick: bool, connections: int = 1) -> None:
        """``connections``: the client threads share that many connections (merge clients, and as many
        echo channels); over one, each its own, as that many agent processes would have (a worker of
        ``ckpt serve --workers`` serves whole connections)."""
        self.sidecar = sidecar
        self.pid = sidecar.process.pid
        self.quick = quick
        self.seconds = 0.8 if quick else 3.0
        self.warmup = 0.25 if quick else 0.75
        target, own = sidecar.targets[0], connections > 1
        self.clients = [CheckpointClient(target, own_connection=own) for _ in range(connections)]
        self.client = self.clients[0]
        options = [("grpc.use_local_subchannel_pool", 1)] if own else []
        self.echo_channels = [grpc.insecure_channel(target, options=options) for _ in range(connections)]
        # No serializers: bytes in, bytes out.
        self.echoes = [channel.unary_unary(ECHO_METHOD) for channel in self.echo_channels]
        self.echo = self.echoes[0]
        # Served only with the store in a process of its own: the echo's bytes cross the link and back.
        self.link_echoes = [channel.unary_unary(LINK_ECHO_METHOD) for channel in self.echo_channels]
        self.state = make_state(STATE_BYTES)
        self.replace_states = [make_state(STATE_BYTES, step=i) for i in range(16)]
        self.patches = make_patches(256)
        self.echo_10k = self.state
        self.echo_request_size = b"x" * merge_request_bytes(self.patches[-1])
        self.max_state_size = {"unary_merge": 0, "stream_merge": 0}

    def close(self) -> None:
        for channel in self.echo_channels:
            channel.close()
        for client in self.clients:
            client.close()

    # Each *_workers returns one callable per thread: run until the event is set, return calls made.

    def echo_workers(self, payload: bytes, *, through_store: bool = False) -> list[Callable[[threading.Event], int]]:
        """Thread i echoes through connection ``i % connections``; ``through_store``: by way of the store process."""
        echoes = self.link_echoes if through_store else self.echoes

        def worker(i: int) -> Callable[[threading.Event], int]:
            echo = echoes[i % len(echoes)]

            def work(stop: threading.Event) -> int:
                n = 0
                while not stop.is_set():
                    if echo(payload, timeout=30) != payload:
                        raise AssertionError("echo returned different bytes")
                    n += 1
                return n

            return work

        return [worker(i) for i in range(CLIENTS)]

    def echo_tasks(self, echo: Any, payload: bytes) -> list[TaskWorker]:
        """:meth:`echo_workers` as asyncio tasks, on one grpc.aio channel's ``echo`` method."""

        async def work(stop: asyncio.Event) -> int:
            n = 0
            while not stop.is_set():
                if await echo(payload, timeout=30) != payload:
                    raise AssertionError("echo returned different bytes")
                n += 1
            return n

        return [work] * CLIENTS

    def merge_tasks(self, client: AsyncCheckpointClient) -> list[TaskWorker]:
        """:meth:`merge_workers` as asyncio tasks: task i merges into its own session through ``client``."""

        def worker(i: int) -> TaskWorker:
            session = _merge_session(i)

            async def work(stop: asyncio.Event) -> int:
                n, size = 0, 0
                while not stop.is_set():
                    size = (await client.merge(session, self.patches[(i + n) % len(self.patches)])).state_size
                    n += 1
                self.max_state_size["unary_merge"] = max(self.max_state_size["unary_merge"], size)
                return n

            return work

        return [worker(i) for i in range(CLIENTS)]

    def measure_tasks(self, kind: str, *, seeded: bool, pids: Sequence[int]) -> Throughput:
        """:meth:`measure` with 64 asyncio tasks on one event loop (uvloop, as the sidecar's; made for
        this reading, on this thread) instead of 64 threads. ``kind``: "echo" (the merge request's size)
        or "merge" (the AsyncCheckpointClient's)."""
        with asyncio.Runner(loop_factory=event_loop_factory("uvloop")) as runner:
            return runner.run(self._tasks_reading(kind, seeded=seeded, pids=pids))

    async def _tasks_reading(self, kind: str, *, seeded: bool, pids: Sequence[int]) -> Throughput:
        target = self.sidecar.targets[0]
        channel = grpc.aio.insecure_channel(target)  # grpc.aio objects belong to the loop they are made on
        client = AsyncCheckpointClient(target)
        try:
            echo = channel.unary_unary(ECHO_METHOD)  # no serializers: bytes in, bytes out

            def make() -> list[TaskWorker]:
                return self.echo_tasks(echo, self.echo_request_size) if kind == "echo" else self.merge_tasks(client)

            if seeded:
                self.seed()
            if self.warmup:
                await run_tasks(make(), self.warmup, pids)
                if seeded:
                    self.seed()
            return await run_tasks(make(), self.seconds, pids)
        finally:
            await client.close()
            await channel.close()

    def seed(self) -> None:
        """REPLACE every merge session with the ~10 KB state (one stream: one group commit)."""
        puts = [
            service_pb2.PutRequest(session_id=_merge_session(i), state=self.state, mode=service_pb2.WRITE_MODE_REPLACE)
            for i in range(CLIENTS)
        ]
        for r in self.client.put_stream(puts, batch_size=CLIENTS):
            if r.HasField("error"):
                raise AssertionError(f"seeding failed: {r.error}")

    def merge_workers(self) -> list[Callable[[threading.Event], int]]:
        """Thread i merges into its own session through connection ``i % connections``."""

        def worker(i: int) -> Callable[[threading.Event], int]:
            session = _merge_session(i)
            client = self.clients[i % len(self.clients)]

            def work(stop: threading.Event) -> int:
                n, size = 0, 0
                while not stop.is_set():
                    size = client.merge(session, self.patches[(i + n) % len(self.patches)]).state_size
                    n += 1
                self.max_state_size["unary_merge"] = max(self.max_state_size["unary_merge"], size)
                return n

            return work

        return [worker(i) for i in range(CLIENTS)]

    def replace_workers(self) -> list[Callable[[threading.Event], int]]:
        def worker(i: int) -> Callable[[threading.Event], int]:
            session = _replace_session(i)

            def work(stop: threading.Event) -> int:
                n = 0
                while not stop.is_set():
                    self.client.put(session, self.replace_states[(i + n) % len(self.replace_states)])
                    n += 1
                return n

            return work

        return [worker(i) for i in range(CLIENTS)]

    def stream_workers(self) -> list[Callable[[threading.Event], int]]:
        per_stream = CLIENTS // STREAMS

        def worker(k: int) -> Callable[[threading.Event], int]:
            sessions = [_merge_session(k * per_stream + j) for j in range(per_stream)]

            def work(stop: threading.Event) -> int:
                window = threading.Semaphore(STREAM_WINDOW)

                def puts() -> Iterator[service_pb2.PutRequest]:
                    n = 0
                    while not stop.is_set():
                        if not window.acquire(timeout=0.05):
                            continue
                        yield service_pb2.PutRequest(
                            session_id=sessions[n % per_stream],
                            state=self.patches[(k + n) % len(self.patches)],
                            mode=service_pb2.WRITE_MODE_MERGE,
                        )
                        n += 1

                done, size = 0, 0
                for r in self.client.put_stream(puts(), batch_size=STREAM_BATCH):
                    if r.HasField("error"):
                        raise AssertionError(f"stream write failed: {r.error}")
                    size = r.response.state_size
                    done += 1
                    window.release()
                self.max_state_size["stream_merge"] = max(self.max_state_size["stream_merge"], size)
                return done

            return work

        return [worker(k) for k in range(STREAMS)]

    def throughputs(self) -> dict[str, list[Throughput]]:
        for i in range(CLIENTS):  # the replace sessions exist before the first measurement
            self.client.put(_replace_session(i), self.replace_states[0])
        one = process_and_children(self.pid)  # its store process too (unless --no-store-process)
        # name: one reading (threads, or *_tasks: asyncio tasks), counting the CPU of the server's processes
        kinds: dict[str, Callable[[], Throughput]] = {
            "echo_10k": lambda: self.measure(lambda: self.echo_workers(self.echo_10k), seeded=False, pids=one),
            "echo_request_size": lambda: self.measure(
                lambda: self.echo_workers(self.echo_request_size), seeded=False, pids=one
            ),
            "echo_request_size_tasks": lambda: self.measure_tasks("echo", seeded=False, pids=one),
            "unary_merge": lambda: self.measure(self.merge_workers, seeded=True, pids=one),
            "unary_merge_tasks": lambda: self.measure_tasks("merge", seeded=True, pids=one),
        }
        if len(one) > 1:  # a store process: what its hop alone costs
            kinds["link_echo_request_size"] = lambda: self.measure(
                lambda: self.echo_workers(self.echo_request_size, through_store=True), seeded=False, pids=one
            )
        kinds["stream_merge"] = lambda: self.measure(self.stream_workers, seeded=True, pids=one)
        kinds["unary_replace_10k"] = lambda: self.measure(self.replace_workers, seeded=False, pids=one)
        results: dict[str, list[Throughput]] = {k: [] for k in kinds}
        for _ in range(REPS):
            for name, reading in kinds.items():
                results[name].append(reading())
        return results

    def measure(
        self,
        make: Callable[[], list[Callable[[threading.Event], int]]],
        *,
        seeded: bool,
        pids: Sequence[int],
        seconds: float | None = None,
        warmup: float | None = None,
    ) -> Throughput:
        """One reading: a warm-up of the same kind, then ``seconds`` (default: the bench's) of it.

        ``seeded``: the merge sessions are re-seeded before both, so the measured
        merges start from ~10 KB states whatever the warm-up appended.
        """
        seconds = self.seconds if seconds is None else seconds
        warmup = self.warmup if warmup is None else warmup
        if seeded:
            self.seed()
        if warmup:
            run_threads(make(), warmup, pids)
            if seeded:
                self.seed()
        return run_threads(make(), seconds, pids)

    def hot_get(self) -> dict[str, Any]:
        """Latest-version get of a ~300 KB cached state vs echo of as many bytes, alternating on one thread."""
        session = "bench-hot"
        state = make_state(HOT_STATE_BYTES)
        self.client.put(session, state)
        got = self.client.get(session)
        if got.state != state:
            raise AssertionError("hot get returned a different state")
        payload = bytes(len(state))
        pairs, warm = (300, 50) if self.quick else (1500, 200)
        get_ns: list[int] = []
        echo_ns: list[int] = []
        gc.collect()
        gc.disable()
        try:
            for i in range(warm + pairs):
                t0 = time.perf_counter_ns()
                self.client.get(session)
                t1 = time.perf_counter_ns()
                self.echo(payload, timeout=30)
                t2 = time.perf_counter_ns()
                if i >= warm:
                    get_ns.append(t1 - t0)
                    echo_ns.append(t2 - t1)
        finally:
            gc.enable()
        return {
            "state_bytes": len(state),
            "pairs": pairs,
            "get_p50_us": percentile(get_ns, 50) / 1e3,
            "get_p99_us": percentile(get_ns, 99) / 1e3,
            "echo_p50_us": percentile(echo_ns, 50) / 1e3,
            "echo_p99_us": percentile(echo_ns, 99) / 1e3,
        }


def machine_info() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "grpcio": grpc.__version__,
    }


def _start(base: Path, name: str, *, source: Path | None = None, extra: tuple[str, ...] = ()) -> SidecarProcess:
    """A ``--bench-echo`` sidecar on its defaults (and ``extra`` options); ``source``: run that checkout's build."""
    base = base.resolve()  # the sidecar may run in another directory
    data_dir = base / name
    shutil.rmtree(data_dir, ignore_errors=True)
    target = f"unix:{base / f'{name}.sock'}"
    return start_sidecar_process(
        data_dir,
        "--bench-echo",
        *extra,
        listen=[target],
        log_path=base / f"{name}.log",
        inherit_ckpt_env=False,
        cwd=source,
    )


def _stop(sidecar: SidecarProcess, *, ok: bool) -> None:
    code = sidecar.stop()
    if ok and code == 0:
        shutil.rmtree(sidecar.data_dir, ignore_errors=True)
        sidecar.log_path.unlink(missing_ok=True)
    elif code != 0:
        print(f"sidecar exited with {code}; log kept at {sidecar.log_path}", file=sys.stderr)
        sidecar.stop(signal.SIGKILL)


def run(*, quick: bool = False, root: Path | None = None, store_process: bool = True) -> Report:
    base = root or data_root()
    base.mkdir(parents=True, exist_ok=True)
    sidecar = _start(base, f"sidecar-{os.getpid()}", extra=() if store_process else ("--no-store-process",))
    ok = False
    try:
        bench = Bench(sidecar, quick=quick)
        try:
            report = Report(
                machine={**machine_info(), "data_dir": str(sidecar.data_dir), "target": sidecar.targets[0]},
                params={
                    "quick": quick,
                    "clients": CLIENTS,
                    "streams": STREAMS,
                    "stream_batch": STREAM_BATCH,
                    "reps": REPS,
                    "seconds_per_rep": bench.seconds,
                    "warmup_seconds": bench.warmup,
                    "state_bytes": len(bench.state),
                    "patch_bytes_mean": statistics.mean(len(p) for p in bench.patches),
                    "merge_request_bytes": len(bench.echo_request_size),
                    "durability": "sync (default)",
                    "store_process": store_process,
                },
            )
            tp = bench.throughputs()
            for name, samples in tp.items():
                rates = [s.rate for s in samples]
                report.throughput[name] = {
                    "rate": statistics.median(rates),
                    "rates": rates,
                    "calls": [s.calls for s in samples],
                    "server_cpu_us_per_call": statistics.median(s.server_cpu_us_per_call for s in samples),
                    "client_cpu_us_per_call": statistics.median(s.client_cpu_us_per_call for s in samples),
                }
            report.params["max_merged_state_bytes"] = dict(bench.max_state_size)
            report.latency = bench.hot_get()
        finally:
            bench.close()
        rate = {k: v["rate"] for k, v in report.throughput.items()}
        lat = report.latency
        # The echo's ceiling is the higher of the two load generators' readings; the unary merge
        # rate a stream must beat, the higher of theirs: neither target gains from the other's choice.
        echo_ceiling = max(rate["echo_request_size"], rate["echo_request_size_tasks"])
        unary_best = max(rate["unary_merge"], rate["unary_merge_tasks"])
        by_name = report.throughput
        report.ratios = {
            "unary_merge_vs_echo_request_size": rate["unary_merge_tasks"] / echo_ceiling,
            "unary_merge_vs_echo_request_size_threads": rate["unary_merge"] / rate["echo_request_size"],
            "unary_merge_vs_echo_10k": rate["unary_merge"] / rate["echo_10k"],
            "stream_vs_unary_merge": rate["stream_merge"] / unary_best,
            "stream_vs_echo_request_size": rate["stream_merge"] / echo_ceiling,
            "unary_replace_10k_vs_echo_10k": rate["unary_replace_10k"] / rate["echo_10k"],
            "hot_get_p50_vs_echo": lat["get_p50_us"] / lat["echo_p50_us"],
            "hot_get_p99_vs_echo": lat["get_p99_us"] / lat["echo_p99_us"],
            # What the rates' ratio would be if both filled the machine's cores: client and
            # server share them, so a call's CPU on both sides is what it costs.
            "unary_merge_vs_echo_request_size_if_cpu_bound": _cpu_per_call(by_name["echo_request_size_tasks"])
            / _cpu_per_call(by_name["unary_merge_tasks"]),
            "unary_merge_vs_echo_request_size_threads_if_cpu_bound": _cpu_per_call(by_name["echo_request_size"])
            / _cpu_per_call(by_name["unary_merge"]),
        }
        if "link_echo_request_size" in rate:
            # How the gap splits: the hop to the store process, then the store's own work.
            report.ratios["link_echo_vs_echo_request_size"] = rate["link_echo_request_size"] / rate["echo_request_size"]
            report.ratios["unary_merge_vs_link_echo_request_size"] = (
                rate["unary_merge"] / rate["link_echo_request_size"]
            )
        got = {
            # The echo with the merge request's own size: same RPCs, same bytes in per call.
            "unary_merge_vs_echo": report.ratios["unary_merge_vs_echo_request_size"],
            "stream_vs_unary_merge": report.ratios["stream_vs_unary_merge"],
            "hot_get_p50_vs_echo": report.ratios["hot_get_p50_vs_echo"],
        }
        for k, v in got.items():
            op, bound = TARGETS[k]
            report.checks[k] = {
                "measured": v,
                "op": op,
                "target": bound,
                "ok": v >= bound if op == ">=" else v <= bound,
            }
        ok = True
        return report
    finally:
        _stop(sidecar, ok=ok)


def _cpu_per_call(throughput: dict[str, Any]) -> float:
    return float(throughput["server_cpu_us_per_call"] + throughput["client_cpu_us_per_call"])


def render(report: Report) -> str:
    p, t, lat, r = report.params, report.throughput, report.latency, report.ratios
    lines = [f"machine: {report.machine}", f"params: {p}", ""]
    lines.append(f"## throughput: one sidecar over its unix socket, median of {p['reps']} x {p['seconds_per_rep']:g} s")
    lines.append("| workload | calls/s (median) | reps | server CPU us/call | client CPU us/call |")
    lines.append("|---|---:|---|---:|---:|")
    labels = {
        "echo_10k": f"echo {p['state_bytes']:,} B, {p['clients']} threads",
        "echo_request_size": f"echo {p['merge_request_bytes']:,} B (= merge request), {p['clients']} threads",
        "echo_request_size_tasks": (
            f"echo {p['merge_request_bytes']:,} B (= merge request), {p['clients']} asyncio tasks"
        ),
        "link_echo_request_size": (
            f"echo {p['merge_request_bytes']:,} B by way of the store process, {p['clients']} threads (info)"
        ),
        "unary_merge": f"unary MERGE ~{p['patch_bytes_mean']:.0f} B patch onto ~10 KB state, {p['clients']} threads",
        "unary_merge_tasks": (
            f"unary MERGE ~{p['patch_bytes_mean']:.0f} B patch onto ~10 KB state, {p['clients']} asyncio tasks"
        ),
        "stream_merge": f"PutStream MERGE, {p['streams']} streams x {p['stream_batch']}/batch",
        "unary_replace_10k": f"unary REPLACE {p['state_bytes']:,} B state, {p['clients']} threads (info)",
    }
    for name, label in labels.items():
        if name not in t:
            continue
        x = t[name]
        reps = ", ".join(f"{v:,.0f}" for v in x["rates"])
        lines.append(
            f"| {label} | {x['rate']:,.0f} | {reps} | {x['server_cpu_us_per_call']:.0f} | "
            f"{x['client_cpu_us_per_call']:.0f} |"
        )
    grew = p["max_merged_state_bytes"]
    lines.append(
        f"\nmerged states start at {p['state_bytes']:,} B every repetition and grew to at most "
        f"{grew['unary_merge']:,} B (unary) / {grew['stream_merge']:,} B (PutStream)"
    )
    lines.append(f"\n## hot get: latest of a {lat['state_bytes']:,} B state, {lat['pairs']} alternating pairs")
    lines.append("| call | p50 us | p99 us |")
    lines.append("|---|---:|---:|")
    lines.append(f"| get (cached) | {lat['get_p50_us']:.0f} | {lat['get_p99_us']:.0f} |")
    lines.append(f"| echo {lat['state_bytes']:,} B | {lat['echo_p50_us']:.0f} | {lat['echo_p99_us']:.0f} |")
    lines.append("\n## ratios")
    lines.append("| ratio | value | target | ok |")
    lines.append("|---|---:|---:|---|")
    check_of = {
        "unary_merge_vs_echo_request_size": "unary_merge_vs_echo",
        "stream_vs_unary_merge": "stream_vs_unary_merge",
        "hot_get_p50_vs_echo": "hot_get_p50_vs_echo",
    }
    info_targets = {"unary_merge_vs_echo_10k": (">=", 0.7)}
    for name, value in r.items():
        if name in check_of:
            c = report.checks[check_of[name]]
            lines.append(f"| {name} | {value:.2f} | {c['op']} {c['target']} | {'yes' if c['ok'] else 'NO'} |")
        elif name in info_targets:
            op, bound = info_targets[name]
            met = value >= bound
            lines.append(f"| {name} (other reading) | {value:.2f} | ({op} {bound}) | ({'yes' if met else 'no'}) |")
        else:
            lines.append(f"| {name} | {value:.2f} | - | - |")
    lines.append(
        "\nunary_merge_vs_echo is judged against the echo of the merge request's own size: the same number of "
        "RPCs carrying the same bytes in, so the ratio isolates what a merge adds (protobuf, store, commit). "
        "The 10 KB echo moves ~20 KB per call that a merge never sends, which would flatter the ratio. "
        "The merges are those of 64 asyncio tasks on one event loop (the AsyncCheckpointClient), against the "
        "higher of the two load generators' echo rates. 64 threads in one process take turns on its GIL, and a "
        "group commit answers its merges together: the threads a commit answers queue for the GIL one behind "
        "another, a wait an echo's replies, which come one by one, do not meet; the tasks take a commit's "
        "answers in one turn of their loop. The _threads rows are the 64 threads' own pairing. "
        "The _if_cpu_bound reading divides the echo's CPU per call (server + client, which share this machine's "
        "cores) by the merge's: the ratio the two rates would have if both kept every core busy."
    )
    if "link_echo_vs_echo_request_size" in r:
        lines.append(
            "The echo by way of the store process crosses the same link as a merge and comes back unread: "
            "link_echo_vs_echo is what the hop to the store process alone leaves of the echo rate (a merge "
            "cannot beat it), unary_merge_vs_link_echo what the store's own work leaves of that."
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="0.8 s repetitions instead of 3 s, fewer latency samples")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument(
        "--no-store-process",
        dest="store_process",
        action="store_false",
        help="measure `ckpt serve --no-store-process` (the store in the sidecar's process; echo and calls alike)",
    )
    args = parser.parse_args(argv)
    report = run(quick=args.quick, store_process=args.store_process)
    return finish(report, render(report), args.json)


if __name__ == "__main__":
    sys.exit(main())
