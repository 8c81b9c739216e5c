"""Load against one real sidecar: its workloads, run on client threads or asyncio tasks, counted.

The workloads (bench.sidecar_bench's docstring says what each measures): the
echo of a payload (through the gRPC process, or by way of the store process),
unary MERGE from threads or asyncio tasks, PutStream MERGE, unary REPLACE, and
the hot Get against the echo of its bytes. A reading runs for a set time and
counts the calls completed and the CPU time the server's processes and this
one spent on them.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from ckpt.v1 import service_pb2

from ..sidecar.client import AsyncCheckpointClient, CheckpointClient
from ..sidecar.server import SidecarProcess, event_loop_factory
from .checkpoint_states import make_patches, make_state
from .echo import ECHO_METHOD, LINK_ECHO_METHOD
from .output import proc_cpu_seconds, process_and_children
from .stats import percentile

CLIENTS = 64
STREAMS = 4
STREAM_BATCH = 128
STREAM_WINDOW = 4 * STREAM_BATCH  # writes a stream may have unanswered: without a bound it runs seconds ahead
STATE_BYTES = 10_000
HOT_STATE_BYTES = 300_000
REPS = 3


# -- workload ------------------------------------------------------------------


def at_least_once(stop: threading.Event | asyncio.Event) -> Iterator[None]:
    """A worker's loop: one call, then more until ``stop`` is set. On a loaded machine a short window
    can close before a thread's first call; every worker then still counts one, so a figure is never
    made of no call at all."""
    yield
    while not stop.is_set():
        yield


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


# -- measuring --------------------------------------------------------------------


def cpu_seconds(pids: Sequence[int]) -> float:
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
        # The servers' CPU read before the workers run: once they do, each file read here waits for the
        # interpreter lock, and the time it took would count as the run's calls without their CPU.
        s0 = cpu_seconds(server_pids)
        start.wait()
        t0 = time.perf_counter_ns()
        c0 = time.process_time()
        stop.wait(seconds)
        stop.set()
        for t in threads:
            t.join()
        elapsed = (time.perf_counter_ns() - t0) / 1e9
        c1, s1 = time.process_time(), cpu_seconds(server_pids)
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
        c0, s0 = time.process_time(), cpu_seconds(server_pids)
        tasks = [asyncio.ensure_future(body(work)) for work in workers]
        await asyncio.wait([asyncio.ensure_future(stop.wait())], timeout=seconds)
        stop.set()
        counts = await asyncio.gather(*tasks, return_exceptions=True)
        elapsed = (time.perf_counter_ns() - t0) / 1e9
        c1, s1 = time.process_time(), cpu_seconds(server_pids)
    finally:
        gc.enable()
    calls = 0
    for count in counts:
        if isinstance(count, BaseException):
            raise count
        calls += count
    return Throughput(calls, elapsed, (s1 - s0) / calls * 1e6, (c1 - c0) / calls * 1e6)


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
        # The echo's bytes cross the link to the store process and back.
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
                for _ in at_least_once(stop):
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
            for _ in at_least_once(stop):
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
                for _ in at_least_once(stop):
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
                for _ in at_least_once(stop):
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
                for _ in at_least_once(stop):
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
                    for _ in at_least_once(stop):
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
        one = process_and_children(self.pid)  # its store process too
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
        # What the hop to the store process alone costs.
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
