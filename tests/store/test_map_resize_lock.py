"""The lock that keeps reads out of an LMDB map resize: shared by reads, exclusive for a resize.

LMDB requires that no transaction is open in the process while the map is resized; a read that ran
through one would read a map being replaced. The lock's own order (a resize waits for the readers in,
new readers wait for the resize) and a store growing its map under readers are both driven here.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path

from ckpt.sidecar import Store, StoreConfig
from ckpt.sidecar.storage import RWLock

WAIT_SECONDS = 10.0


def test_a_resize_waits_for_every_reader_in_and_readers_wait_for_the_resize() -> None:
    lock = RWLock()
    lock.acquire_shared()
    lock.acquire_shared()
    entered = threading.Event()
    leave = threading.Event()

    def resize() -> None:
        with lock.exclusive():
            entered.set()
            leave.wait(WAIT_SECONDS)

    resizer = threading.Thread(target=resize)
    resizer.start()
    assert not entered.wait(0.2)  # two readers in
    lock.release_shared()
    assert not entered.wait(0.2)  # one reader in
    lock.release_shared()
    assert entered.wait(WAIT_SECONDS)  # none: the resize runs
    assert not lock.idle

    reader_in = threading.Event()

    def read() -> None:
        with lock.shared():
            reader_in.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert not reader_in.wait(0.2)  # a reader waits while the resize runs
    leave.set()
    assert reader_in.wait(WAIT_SECONDS)  # and goes on once it ends
    resizer.join(WAIT_SECONDS)
    reader.join(WAIT_SECONDS)
    assert lock.idle


def test_a_second_resize_waits_for_the_first() -> None:
    lock = RWLock()
    order: list[str] = []
    first_in = threading.Event()
    release_first = threading.Event()

    def first() -> None:
        with lock.exclusive():
            first_in.set()
            release_first.wait(WAIT_SECONDS)
            order.append("first")

    def second() -> None:
        with lock.exclusive():
            order.append("second")

    a = threading.Thread(target=first)
    a.start()
    assert first_in.wait(WAIT_SECONDS)
    b = threading.Thread(target=second)
    b.start()
    b.join(0.2)
    assert b.is_alive() and order == []
    release_first.set()
    a.join(WAIT_SECONDS)
    b.join(WAIT_SECONDS)
    assert order == ["first", "second"] and lock.idle


def test_reads_on_other_threads_go_on_while_the_writer_grows_the_map(tmp_path: Path) -> None:
    """A 1 MiB map grown several times by writes while four threads read: every read is whole."""
    states = {f"s{k}": bytes([k]) * 2000 for k in range(8)}
    with Store(StoreConfig(data_dir=tmp_path / "data", map_size_bytes=1 << 20)) as store:
        for sid, state in states.items():
            store.put(sid, state)
        stop = threading.Event()
        failures: list[str] = []
        reads = [0]

        def reader() -> None:
            while not stop.is_set():
                for sid, state in states.items():
                    got = store.get(sid).state
                    if got != state:
                        failures.append(f"{sid}: {len(got)} bytes")
                    reads[0] += 1

        threads = [threading.Thread(target=reader) for _ in range(4)]
        for t in threads:
            t.start()
        try:
            rng = random.Random(0)
            for n in range(60):  # incompressible: ~4.8 MB through a 1 MiB map
                store.put(f"big{n}", rng.randbytes(80_000))
        finally:
            stop.set()
            for t in threads:
                t.join(WAIT_SECONDS)
        assert store.counters.map_resizes >= 2
        assert reads[0] > 0 and not failures
