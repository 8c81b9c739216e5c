"""Blocked writers of one commit are woken in turn, each by the one before, and none is left waiting."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import pytest

from ckpt.sidecar import Store, StoreConfig
from ckpt.sidecar.store.ops import Op, wake_in_turn
from tests.store.support import hold_writer, wait_queued


class _Interrupted(Exception):
    pass


def _op() -> Op:
    return Op(lambda batch, txn: None, fails_clean=True, wakes_in_turn=True)


def _waiters(ops: list[Op], skip: set[int]) -> tuple[list[threading.Thread], dict[int, object]]:
    got: dict[int, object] = {}

    def wait(i: int) -> None:
        got[i] = ops[i].wait()

    threads = [threading.Thread(target=wait, args=(i,), daemon=True) for i in range(len(ops)) if i not in skip]
    for t in threads:
        t.start()
    return threads, got


@pytest.mark.parametrize(
    "abandoned",
    [set(), {0}, {2}, {5}, {1, 2, 3}, {0, 1, 2, 3, 4, 5}],
    ids=["none", "first", "middle", "last", "a-run", "all"],
)
def test_every_waiter_is_woken_though_some_left(abandoned: set[int]) -> None:
    # A caller interrupted in its wait never wakes the next: whoever wakes it
    # must go on down the line for it.
    ops = [_op() for _ in range(6)]
    for i in abandoned:
        ops[i]._abandoned = True
    threads, got = _waiters(ops, skip=abandoned)
    wake_in_turn([(op, f"result {i}", None) for i, op in enumerate(ops)])
    for t in threads:
        t.join(10)
        assert not t.is_alive(), "a waiter was never woken"
    assert got == {i: f"result {i}" for i in range(6) if i not in abandoned}
    assert all(op.resolved for op in ops)


class _InterruptedLock:
    """A lock whose acquire is interrupted, as by a signal handler raising in the waiting thread."""

    def acquire(self, blocking: bool = True) -> bool:
        raise _Interrupted

    def release(self) -> None:
        pass


def test_a_wait_abandoned_after_its_wake_still_wakes_the_next() -> None:
    # The waker released the first wait while it was still on (so went no
    # further down the line); its caller then leaves without returning from
    # acquire, and must wake the next itself.
    ops = [_op() for _ in range(3)]
    ops[0]._done = _InterruptedLock()  # type: ignore[assignment]
    threads, got = _waiters(ops, skip={0})
    wake_in_turn([(op, i, None) for i, op in enumerate(ops)])
    with pytest.raises(_Interrupted):
        ops[0].wait()
    for t in threads:
        t.join(10)
        assert not t.is_alive(), "the waiters after an abandoned wait were never woken"
    assert got == {1: 1, 2: 2}


def test_an_error_reaches_its_own_waiter_only() -> None:
    ops = [_op() for _ in range(3)]
    outcomes: dict[int, object] = {}

    def wait(i: int) -> None:
        try:
            outcomes[i] = ops[i].wait()
        except ValueError as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=wait, args=(i,), daemon=True) for i in range(3)]
    for t in threads:
        t.start()
    error = ValueError("conflict")
    wake_in_turn([(ops[0], "a", None), (ops[1], None, error), (ops[2], "c", None)])
    for t in threads:
        t.join(10)
    assert outcomes == {0: "a", 1: error, 2: "c"}


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs POSIX interval timers")
def test_a_put_interrupted_by_a_signal_leaves_no_other_writer_waiting(tmp_path: Path) -> None:
    # The main thread's write is queued first, 16 threads' writes behind it,
    # all in one commit; a signal handler raises in the main thread while it
    # waits. The others must each be answered (they wake in turn; the main
    # thread's write is answered on its own), and the interrupted write still
    # commits (a queued write cannot be withdrawn).
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        gate = hold_writer(store)
        done: dict[int, int] = {}

        def writer(i: int) -> None:
            done[i] = store.put(f"w{i}", b"\x08\x01").version

        threads = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(16)]

        def start_the_others_behind_main() -> None:
            wait_queued(store, 1)
            for t in threads:
                t.start()
            wait_queued(store, 17)
            signal.setitimer(signal.ITIMER_REAL, 0.05)

        def interrupt(signum: int, frame: object) -> None:
            gate.set()  # the writer commits all 17 once the main thread has left its wait
            raise _Interrupted

        old = signal.signal(signal.SIGALRM, interrupt)
        try:
            starter = threading.Thread(target=start_the_others_behind_main, daemon=True)
            starter.start()
            with pytest.raises(_Interrupted):
                store.put("main", b"\x08\x02")
            starter.join(10)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        for t in threads:
            t.join(10)
            assert not t.is_alive(), "a writer queued behind the interrupted one was never answered"
        assert done == {i: 1 for i in range(16)}
        assert store.get("main").state == b"\x08\x02"
        assert store.counters.batch_sizes[17] == 1


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="needs pthread_kill")
def test_a_signal_between_queueing_and_waiting_in_the_main_thread_leaves_no_writer_waiting(tmp_path: Path) -> None:
    # A signal handler raising in the main thread just after its write is
    # queued, before it waits: were that write woken in turn, nobody would
    # wake the writers queued behind it.
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        gate = hold_writer(store)
        main = threading.get_ident()
        # A private hook: a signal landing between queueing and waiting has no public way in.
        queue = store._writer.queue

        class SignalledAfterPut:
            armed = True

            def put(self, item: Op | None) -> None:
                queue.put(item)
                if self.armed and threading.get_ident() == main and item is not None:
                    self.armed = False
                    signal.pthread_kill(main, signal.SIGUSR1)

            def __getattr__(self, name: str) -> object:
                return getattr(queue, name)

        def interrupt(signum: int, frame: object) -> None:
            raise _Interrupted

        old = signal.signal(signal.SIGUSR1, interrupt)
        try:
            store._writer.queue = SignalledAfterPut()  # type: ignore[assignment]
            with pytest.raises(_Interrupted):
                store.put("main", b"\x08\x01")
        finally:
            store._writer.queue = queue
            signal.signal(signal.SIGUSR1, old)
        done: dict[int, int] = {}

        def writer(i: int) -> None:
            done[i] = store.put(f"w{i}", b"\x08\x01").version

        threads = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(8)]
        for t in threads:
            t.start()
        wait_queued(store, 9)
        gate.set()
        for t in threads:
            t.join(10)
            assert not t.is_alive(), "a writer queued behind the interrupted one was never answered"
        assert done == {i: 1 for i in range(8)}
        assert store.get("main").version == 1


def test_writes_from_worker_threads_wake_in_turn_and_the_main_threads_do_not(tmp_path: Path) -> None:
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        seen: list[bool] = []
        # A private hook: which ops wake in turn is decided as they are queued, and shows nowhere else.
        writer = store._writer
        submit = writer.run_or_submit

        def recording(op: Op) -> Op:
            seen.append(op.wakes_in_turn)
            return submit(op)

        writer.run_or_submit = recording  # type: ignore[method-assign]
        store.put("main", b"")
        worker = threading.Thread(target=store.put, args=("worker", b""))
        worker.start()
        worker.join(10)
        assert seen == [False, True]
