"""How long a large write holds up other sessions' small writes.

    python -m ckpt.bench.large_write_stall [--state-mb N] [--replaces N] [--merges N] [--rounds N] [--data-dir DIR]

One thread writes a session of ``--state-mb`` MB: ``--replaces`` REPLACE puts
of whole states, then ``--merges`` MERGE puts of 1 KB patches onto that head
(``--rounds`` times under each chain policy, taking turns: the default, whose
MERGE chains of large states write segments, and one without segments, where
every 65th write starts a new chain: a FULL frame of the whole head); then a
sweep folds the quiet head (its whole state decoded and compressed again), and
another sweeps it after 20 more MERGEs.
Meanwhile another thread puts 1 KB states to
16 other sessions in turn, one at a time. Printed per phase: each large put's
time, the small puts' count, median and longest wait (from the call to its
return), and for MERGE the frame bytes the large session wrote and its FULL
frames. A small put's longest wait is what a large write held it up.

A real Store on a real directory (``--data-dir``, default ``$CKPT_BENCH_DIR``,
else ``.bench-data/``), fsync on; removed when done.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import threading
import time
from pathlib import Path

from ..codec import ChainPolicy, FrameKind
from ..sidecar import Store, StoreConfig, WriteMode


def _state(size: int, salt: int) -> bytes:
    """``size`` bytes that compress about 2:1 (hex of random bytes), differing per ``salt``."""
    half = os.urandom(size // 2).hex().encode()
    return (salt.to_bytes(8, "little") + half)[:size]


def _patch(i: int) -> bytes:
    body = (b"%08d" % i) * 128  # 1 KB
    return b"\x0a" + bytes([0x80 | (len(body) & 0x7F), len(body) >> 7]) + body


class SmallWrites:
    """Small puts to other sessions, one at a time, until stopped; their waits in seconds."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.waits: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="small-writes")

    def _run(self) -> None:
        i = 0
        state = b"s" * 1024
        while not self._stop.is_set():
            began = time.perf_counter()
            self._store.put(f"small-{i % 16}", state)
            self.waits.append(time.perf_counter() - began)
            i += 1

    def __enter__(self) -> SmallWrites:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _report(phase: str, large: list[float], small: list[float], extra: str = "") -> None:
    print(
        f"{phase}: {len(large)} large puts, {statistics.median(large):.3f} s median, {max(large):.3f} s longest;"
        f" {len(small)} small puts, {statistics.median(small) * 1e3:.2f} ms median wait,"
        f" longest wait {max(small):.3f} s{extra}"
    )


def _merges(store: Store, merges: int) -> tuple[list[float], list[float], int, int]:
    """``merges`` MERGE puts onto the large head with small writes going on: the large puts' times, the
    small puts' waits, the large session's frame bytes written and its FULL frames."""
    large: list[float] = []
    written = fulls = 0
    with SmallWrites(store) as small:
        for i in range(merges):
            began = time.perf_counter()
            result = store.put("large", _patch(i), mode=WriteMode.MERGE)
            large.append(time.perf_counter() - began)
            written += result.stored_bytes
            fulls += result.frame_kind is FrameKind.FULL
    return large, small.waits, written, fulls


def _fold(store: Store, config: StoreConfig) -> tuple[int, float, list[float]]:
    """A sweep that folds the large head, as once it has been quiet for ``fold_after_quiet_seconds``, with
    small writes going on: heads folded, the sweep's time, the small puts' waits."""
    quiet = config.fold_after_quiet_seconds or 0.0
    with SmallWrites(store) as small:
        time.sleep(0.2)  # small writes under way before the sweep starts
        began = time.perf_counter()
        done = store.sweep(now_nanos=time.time_ns() + int((quiet + 1) * 1e9))
        took = time.perf_counter() - began
        time.sleep(0.2)
    return done.heads_folded, took, small.waits


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--state-mb", type=int, default=150)
    p.add_argument("--replaces", type=int, default=4)
    p.add_argument("--merges", type=int, default=140)
    p.add_argument("--rounds", type=int, default=1, help="MERGE phases under each chain policy, taking turns")
    p.add_argument("--data-dir", type=Path, help="scratch directory (default $CKPT_BENCH_DIR, else .bench-data)")
    args = p.parse_args()
    root = args.data_dir or Path(os.environ.get("CKPT_BENCH_DIR", ".bench-data"))
    size = args.state_mb * 1024 * 1024
    states = [_state(size, salt) for salt in range(2)]
    policies = {"segments": ChainPolicy(), "no segments": ChainPolicy(segment_fanout=0)}
    for r in range(args.rounds):
        for name in list(policies) if r % 2 == 0 else list(reversed(policies)):
            data_dir = root / "large-write-stall"
            shutil.rmtree(data_dir, ignore_errors=True)
            config = StoreConfig(data_dir=data_dir, max_state_bytes=2 * size + (1 << 20), chain_policy=policies[name])
            store = Store(config)
            try:
                for i in range(16):
                    store.put(f"small-{i}", b"s" * 1024)
                store.put("large", states[1])  # the session exists: the REPLACEs below continue its chain
                if args.replaces:
                    large: list[float] = []
                    with SmallWrites(store) as small:
                        for i in range(args.replaces):
                            began = time.perf_counter()
                            store.put("large", states[i % 2])
                            large.append(time.perf_counter() - began)
                    _report(f"[{name}] REPLACE", large, small.waits)
                began = time.perf_counter()
                large, waits, written, fulls = _merges(store, args.merges)
                took = time.perf_counter() - began
                extra = f"; {took:.2f} s in all; frames written {written / 1e6:.2f} MB, {fulls} FULL"
                _report(f"[{name}] MERGE", large, waits, extra)
                folded, took, waits = _fold(store, config)
                _report(f"[{name}] FOLD", [took], waits, f"; {folded} heads folded")
                _merges(store, 20)  # a short run onto the folded head: not worth a second fold (folds.py)
                folded, took, waits = _fold(store, config)
                _report(f"[{name}] FOLD after 20 MERGEs more", [took], waits, f"; {folded} heads folded")
            finally:
                store.close()
                shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
