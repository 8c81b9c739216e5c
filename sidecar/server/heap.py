"""Give the C heap's free memory back to the OS after a burst (glibc's ``malloc_trim``).

A burst of large writes or reads passes hundreds of MiB through malloc:
request and response buffers in gRPC, states, frames. Once freed, glibc keeps
most of it: the per-thread arenas the writer and gRPC's threads allocate
from are only shrunk by ``malloc_trim``, never on free. Measured on a real
sidecar with 1 MiB caches: 64 clients putting 1 MB states left 106 MiB of
anonymous memory resident for good, against 22 MiB idle; ``malloc_trim(0)``
took it to 49 MiB. With the default caches: 583 MiB, then 416 MiB (what is
left is the caches, which stay within their budgets).

So the sidecar trims on a timer, and only after the store did something since
the last trim: an idle sidecar makes no calls at all.

While it trims, it also has glibc keep freed large blocks for reuse instead
of returning each to the OS as it is freed (:func:`keep_freed_blocks`): by
default a block from 128 KiB on is a mapping of its own, unmapped on free,
and the heap's top is returned past twice that, so the next request or reply
of that size faults every page in again. On the project's VMs a page fault
costs ~7 us: a fresh 300 KB buffer ~510 us against ~16 us reused, and a hot
``Get`` of a 300 KB state took 1,613-2,375 us at p50 against 2,365-4,359
without (6 alternating rounds, two sidecars; the 300 KB echo 1,164-1,654
against 1,726-3,033 us). What is kept is returned by the next trim.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("ckpt")


def _load_malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim  # ctypes releases the GIL around the call
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim with
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_MALLOC_TRIM = _load_malloc_trim()

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Blocks up to this size come from the heap, not a mapping of their own: 32 MiB, the
#: most glibc's own rule raises its 128 KiB default to after freeing such blocks.
KEEP_BLOCKS_UP_TO_BYTES = 32 << 20
#: Free memory at the top of a heap is returned by glibc itself (on a free) only past this size.
#: Below a thread arena's 64 MiB heap: malloc_trim returns free memory inside every arena but the
#: top only of the main one, so the top of a thread's arena (gRPC's threads read messages into
#: theirs) is returned only by this rule. At 4x KEEP_BLOCKS_UP_TO_BYTES (128 MiB) it never was:
#: after bursts of 40 MiB Puts and Gets the gRPC process kept 158-175 MiB idle, where glibc's
#: defaults keep 91 MiB and this size 81-84 MiB (3 rounds each, 3 sessions x 4 x 40 MiB a round).
KEEP_FREE_TOP_BYTES = 16 << 20
#: A reply the sidecar builds from many states (a page of versions with them) ends once it holds this
#: many bytes: well under KEEP_FREE_TOP_BYTES, so each process it crosses reuses the blocks of the one
#: before. A 200-version LangGraph history (42 MB of states) listed 100 versions a page took 320-800 ms
#: warm, every page faulted in afresh (~30,000 faults in each process), against 110-270 ms in pages of
#: ~4 MB; a first listing took 2.3-2.8 s, 1.65 s of it the store process's CPU.
REPLY_PAGE_BYTES = KEEP_FREE_TOP_BYTES // 4


def _load_mallopt() -> Callable[[int, int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt


_MALLOPT = _load_mallopt()


def keep_freed_blocks() -> bool:
    """Have glibc keep freed large blocks for reuse rather than unmap or trim them at once.

    Only for a process that runs a :class:`HeapTrimmer` (it calls this when it
    starts): what is kept is returned on its timer. Whether glibc took it.
    """
    if _MALLOPT is None or _MALLOC_TRIM is None:
        return False
    return bool(_MALLOPT(_M_MMAP_THRESHOLD, KEEP_BLOCKS_UP_TO_BYTES)) and bool(
        _MALLOPT(_M_TRIM_THRESHOLD, KEEP_FREE_TOP_BYTES)
    )


def can_trim() -> bool:
    """Whether this process's C library has ``malloc_trim`` (glibc does)."""
    return _MALLOC_TRIM is not None


def trim_heap() -> bool:
    """Return the C heap's free pages to the OS now; whether there was anything to return."""
    if _MALLOC_TRIM is None:
        return False
    return bool(_MALLOC_TRIM(0))


def anonymous_resident_bytes(pid: int | None = None) -> int | None:
    """Resident anonymous memory of process ``pid`` (default: this one) on Linux; None where /proc does not say.

    Not VmRSS: that also counts the pages of data.mdb that reads and writes
    touch, which are the kernel's page cache, shared and reclaimable.
    """
    try:
        with open(f"/proc/{pid or 'self'}/status", "rb") as status:
            for line in status:
                if line.startswith(b"RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class HeapTrimmer:
    """A daemon thread that calls :func:`trim_heap` every ``interval_seconds`` after activity.

    ``activity`` returns a number that changes whenever the process may have
    freed memory worth returning (the store's commits and reads); a tick that
    sees the same number as the last trim does nothing.
    """

    def __init__(self, interval_seconds: float, activity: Callable[[], int]) -> None:
        if not interval_seconds > 0:
            raise ValueError(f"interval_seconds must be > 0, got {interval_seconds}")
        self.interval_seconds = interval_seconds
        self._activity = activity
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ckpt-heap-trim", daemon=True)
        #: Trims done.
        self.trims = 0

    def start(self) -> None:
        if can_trim():
            keep_freed_blocks()  # this thread returns them
            self._thread.start()
        else:
            log.info("heap trimming is off: this C library has no malloc_trim")

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        trimmed_at = self._activity()
        while not self._stop.wait(self.interval_seconds):
            now = self._activity()
            if now == trimmed_at:
                continue
            trimmed_at = now
            debug = log.isEnabledFor(logging.DEBUG)  # the /proc reads are for that log line only
            before = anonymous_resident_bytes() if debug else None
            start = time.perf_counter()
            trim_heap()
            self.trims += 1
            if debug:
                log.debug(
                    "heap trimmed in %.1f ms: anonymous resident %s -> %s bytes",
                    (time.perf_counter() - start) * 1e3,
                    before,
                    anonymous_resident_bytes(),
                )
