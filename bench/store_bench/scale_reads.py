"""The scale run's cold reads: random picks timed as filled, from disk, after a pre-read, and each from disk."""

from __future__ import annotations

import gc
import os
import random
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...sidecar import Store
from .common import summary
from .scale_data import VERSIONS_PER_SESSION, ScaleData


def major_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_majflt


def _picks(sessions: int, reads: int, seed: int) -> list[tuple[int, int]]:
    """``reads`` random (session, older version) pairs among the first ``sessions``."""
    rng = random.Random(seed)
    return [(rng.randrange(sessions), rng.randrange(1, VERSIONS_PER_SESSION)) for _ in range(reads)]


def _pass_result(latest: list[float], old: list[float], faulted: list[int], mismatches: int) -> dict[str, Any]:
    return {
        "latest_us": summary(latest),
        "old_version_us": summary(old),
        "latest_reads_with_major_fault": faulted[0],
        "old_reads_with_major_fault": faulted[1],
        "latest_reads_timed": len(latest),
        "old_reads_timed": len(old),
        "mismatches": mismatches,
    }


def read_pass(
    store: Store, data: ScaleData, sessions: int, reads: int, seed: int, *, cached_only: bool = False
) -> dict[str, Any]:
    """One pass of random cold reads among the first ``sessions``: the latest version, then a random older one
    of the same session. Major page faults (a page the OS had to read from disk) are counted outside the
    timed calls. ``cached_only``: a pass meant to find every page cached leaves the reads that waited on
    the disk out of its percentiles (they are counted): the kernel pages out memory it finds idle (DAMON),
    and 60 of 20,000 such reads once moved the pass's p99 by 1.6x."""
    picks = _picks(sessions, reads, seed)
    latest: list[float] = []
    old: list[float] = []
    faulted = [0, 0]
    mismatches = 0
    gc.collect()
    for i, v in picks:
        sid = data.session_id(i)
        f0 = major_faults()
        t0 = time.perf_counter_ns()
        a = store.get(sid)
        t1 = time.perf_counter_ns()
        f1 = major_faults()
        t2 = time.perf_counter_ns()
        b = store.get(sid, v)
        t3 = time.perf_counter_ns()
        f2 = major_faults()
        if not (cached_only and f1 > f0):
            latest.append((t1 - t0) / 1e3)
        if not (cached_only and f2 > f1):
            old.append((t3 - t2) / 1e3)
        faulted[0] += f1 > f0
        faulted[1] += f2 > f1
        if a.state != data.state(i, VERSIONS_PER_SESSION) or b.state != data.state(i, v):
            mismatches += 1
    return _pass_result(latest, old, faulted, mismatches)


def each_read_from_disk(
    stores: list[tuple[Callable[[], Store], Store, int]], data: ScaleData, reads: int, seed: int
) -> tuple[list[Store], list[dict[str, Any]]]:
    """``reads`` picks per store as in :func:`read_pass`, but every get starts with nothing of its data file cached.

    ``stores`` holds (open it again, the open store, its session count) per
    store. Before each timed get the store is closed (LMDB unmaps the file),
    the file's pages are dropped from the page cache and the store is
    reopened, so each read is the first after a reboot at either size: its
    B-tree descent and frames come from the disk, and no earlier read of the
    pass cached pages for it, however small the file. The stores take turns
    pick by pick (which goes first alternating), so a slow minute of the
    shared disk or CPU falls on every size alike: the sizes' p99s are
    compared side by side, not minutes apart.
    Returns the reopened stores with one result per store.
    """
    opened = [store for _, store, _ in stores]
    picks = [_picks(sessions, reads, seed) for _, _, sessions in stores]
    # Per store: version 0 (latest), then the older one.
    timings: list[dict[int, list[float]]] = [{0: [], 1: []} for _ in stores]
    faulted = [[0, 0] for _ in stores]
    mismatches = [0 for _ in stores]
    for k in range(reads):
        order = range(len(stores)) if k % 2 == 0 else reversed(range(len(stores)))
        for j in order:
            open_store = stores[j][0]
            i, old = picks[j][k]
            for slot, version in enumerate((0, old)):
                data_file = opened[j].config.data_dir / "lmdb" / "data.mdb"
                opened[j].close()
                evict_from_page_cache(data_file)
                opened[j] = store = open_store()
                f0 = major_faults()
                t0 = time.perf_counter_ns()
                got = store.get(data.session_id(i), version)
                t1 = time.perf_counter_ns()
                faulted[j][slot] += major_faults() > f0
                timings[j][slot].append((t1 - t0) / 1e3)
                mismatches[j] += got.state != data.state(i, version or VERSIONS_PER_SESSION)
    results = [_pass_result(t[0], t[1], f, m) for t, f, m in zip(timings, faulted, mismatches, strict=True)]
    return opened, results


def _read_whole_file(path: Path) -> float:
    """Read a file sequentially (into the OS page cache); seconds taken."""
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as fh:
        while fh.read(1 << 20):
            pass
    return time.perf_counter() - t0


def evict_from_page_cache(path: Path) -> None:
    """Ask the OS to drop a file's cached pages (posix_fadvise DONTNEED).

    Only pages no process maps are dropped, so the store must be closed. LMDB
    has synced every page it wrote, so all of them are clean and can go.
    """
    if not hasattr(os, "posix_fadvise"):
        raise RuntimeError("the scale benchmark's 'from disk' pass needs os.posix_fadvise (Linux, BSD)")
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def probe_reads(
    open_store: Callable[[], Store],
    store: Store,
    data: ScaleData,
    sessions: int,
    reads: int,
    seed: int,
) -> tuple[Store, dict[str, Any]]:
    """Three passes of ``reads`` random cold reads (latest + an older version each), fresh picks each pass.

    "as filled": the pages as the fill left them. The first 10,000 sessions
    were written moments before; at N most pages were written minutes
    earlier, and the OS may have evicted some (reads then wait on the disk:
    counted as major faults). Then the store is closed, the data file's pages
    are dropped from the page cache and the store reopened, as after a
    reboot: "from disk". Every page starts on the disk, but each read
    caches pages for the next, and a small file is soon all cached (at
    10,000 sessions about one read in five waits on the disk, at 1,000,000
    nearly all), so this pass is reported, not checked. Then "file
    pre-read": after one sequential read of data.mdb, so that every page is
    in the page cache, for both sizes alike. ("each read from disk", see
    :func:`each_read_from_disk`, is timed once every size is filled.)
    Returns the reopened store with the results.
    """

    def warm_up(store: Store) -> None:  # allocator, code paths, LMDB's root pages
        for i in random.Random(seed - 1).sample(range(sessions), min(1000, sessions)):
            store.get(data.session_id(i))

    warm_up(store)
    as_filled = read_pass(store, data, sessions, reads, seed)
    data_file = store.config.data_dir / "lmdb" / "data.mdb"
    store.close()
    evict_from_page_cache(data_file)
    store = open_store()
    from_disk = read_pass(store, data, sessions, reads, seed + 2)
    preread_s = _read_whole_file(data_file)
    warm_up(store)
    preread = read_pass(store, data, sessions, reads, seed + 1, cached_only=True)
    passes = {"as filled": as_filled, "from disk": from_disk, "file pre-read": preread}
    return store, {
        "sessions": sessions,
        "reads_each": reads,
        "passes": passes,
        "preread_seconds": preread_s,
        "mismatches": sum(p["mismatches"] for p in passes.values()),
    }
