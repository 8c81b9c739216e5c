"""A sidecar gives the memory a burst freed back to the OS (heap.py, --heap-trim-interval-seconds).

glibc keeps what its per-thread arenas free: without the trimmer a real
sidecar with 1 MiB caches stayed at 167-189 MiB of anonymous memory after the
burst below, against 22 MiB idle; with it, 44-63 MiB.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ckpt.sidecar.client import CheckpointClient
from ckpt.sidecar.server.heap import HeapTrimmer, anonymous_resident_bytes
from tests.support import start_sidecar

MIB = 1024 * 1024
WRITERS = 64
WRITES_EACH = 4
STATE_BYTES = 1_000_000


def _anonymous_resident(pid: int) -> int:
    resident = anonymous_resident_bytes(pid)
    assert resident is not None, "no RssAnon in /proc/PID/status"
    return resident


def _state(writer: int, version: int) -> bytes:
    # Half incompressible, so frames are as large as the requests.
    return os.urandom(STATE_BYTES // 2) + bytes([writer, version]) * (STATE_BYTES // 4)


def test_a_sidecar_returns_what_a_burst_freed(tmp_path: Path) -> None:
    sidecar = start_sidecar(
        tmp_path / "data",
        "--heap-trim-interval-seconds",
        "0.3",
        "--cache-size-bytes",
        str(MIB),
        "--encoder-cache-bytes",
        str(MIB),
    )
    pid = sidecar.process.pid
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            client.put("warm", b"")  # the first call's one-off allocations are not the burst's
            time.sleep(1.0)
            idle = _anonymous_resident(pid)
            last: dict[str, bytes] = {}
            errors: list[BaseException] = []

            def write(writer: int) -> None:
                try:
                    for version in range(1, WRITES_EACH + 1):
                        state = _state(writer, version)
                        client.put(f"s{writer}", state)
                    last[f"s{writer}"] = state
                except BaseException as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=write, args=(w,)) for w in range(WRITERS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not errors, errors[0]
            # 256 MB went through; what stays resident once trimmed is the
            # 1 MiB caches, gRPC's own buffers and allocator slack.
            bound = idle + 80 * MIB
            deadline = time.monotonic() + 15
            while (now := _anonymous_resident(pid)) > bound and time.monotonic() < deadline:
                time.sleep(0.2)
            assert now <= bound, f"{now / MIB:.0f} MiB resident, idle was {idle / MIB:.0f} MiB"
            # Trimming frees only free memory: every session still reads back.
            for session, state in last.items():
                got = client.get(session)
                assert (got.version, got.state) == (WRITES_EACH, state)
    finally:
        assert sidecar.stop() == 0


def test_the_trimmer_trims_only_after_activity() -> None:
    activity = [0]
    trimmer = HeapTrimmer(0.05, lambda: activity[0])
    trimmer.start()
    try:
        time.sleep(0.4)
        assert trimmer.trims == 0  # nothing happened: an idle sidecar makes no calls
        activity[0] += 1
        deadline = time.monotonic() + 5
        while trimmer.trims == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert trimmer.trims == 1
        time.sleep(0.3)
        assert trimmer.trims == 1  # once per burst of activity, not every tick
    finally:
        trimmer.stop()


@pytest.mark.parametrize("interval", [0.0, -1.0, float("nan")])
def test_the_trimmer_refuses_an_interval_that_is_not_positive(interval: float) -> None:
    with pytest.raises(ValueError, match="interval_seconds must be > 0"):
        HeapTrimmer(interval, lambda: 0)


_REUSE_PROBE = """
import resource, sys
from ckpt.sidecar.server.heap import keep_freed_blocks
if sys.argv[1] == "keep":
    assert keep_freed_blocks()
size = 8 << 20
block = b"x" * size  # written through: every page touched
del block
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
block = b"y" * size
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.parametrize("mode", ["keep", "glibc-default"])
def test_a_process_that_trims_reuses_a_freed_large_block(mode: str) -> None:
    """keep_freed_blocks (HeapTrimmer.start calls it): a second 8 MiB buffer reuses the first's pages,
    where by default it is a fresh mapping whose 2,048 pages all fault in (~7 us each on our VMs)."""
    out = subprocess.run(
        [sys.executable, "-c", _REUSE_PROBE, mode], capture_output=True, text=True, check=True, timeout=60
    )
    faults = int(out.stdout)
    pages = (8 << 20) // os.sysconf("SC_PAGE_SIZE")
    if mode == "keep":
        assert faults < pages // 10
    else:
        assert faults > pages // 2  # the control: what the test would see if nothing were kept


_THREAD_ARENA_PROBE = """
import sys, threading
from ckpt.sidecar.server.heap import anonymous_resident_bytes, keep_freed_blocks, trim_heap
assert keep_freed_blocks()
start = anonymous_resident_bytes()

def burst():
    blocks = [b"x" * (1 << 20) for _ in range(40)]  # 40 MiB, every page touched, in this thread's arena
    del blocks

thread = threading.Thread(target=burst)
thread.start()
thread.join()
trim_heap()
print(anonymous_resident_bytes() - start)
"""


def test_a_trim_returns_what_a_threads_arena_freed() -> None:
    """malloc_trim returns free memory at the top of the main arena only; a thread's arena (gRPC's
    threads read messages into theirs) gives its top back on a free, past KEEP_FREE_TOP_BYTES. At
    128 MiB that never happened: 40 MiB freed by a thread stayed resident for good."""
    out = subprocess.run(
        [sys.executable, "-c", _THREAD_ARENA_PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    assert int(out.stdout) < 8 * MIB, f"{int(out.stdout) / MIB:.0f} MiB still resident after the trim"
