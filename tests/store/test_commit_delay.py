"""The writer's commit delay (writers a commit answered share the next commit, a lone writer never waits),
and the time its commits take."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from ckpt.sidecar import PutRequest, PutResult, Store, StoreConfig
from ckpt.sidecar.client import CheckpointClient
from tests.store.support import hold_writer, put_later, room_waiters, sleeping_op, submit_op, wait_queued
from tests.support import Sidecar, free_port, start_sidecar

WRITERS = 8


def _answered_together(store: Store, threads: list[threading.Thread], *, commit_seconds: float = 0.0) -> None:
    """Run ``threads`` to the end, their first writes queued behind a held writer so that one commit
    answers them all; with ``commit_seconds``, that commit takes so long (bounding the next delay)."""
    gate = hold_writer(store)
    for t in threads:
        t.start()
    wait_queued(store, len(threads))
    if commit_seconds:
        submit_op(store, sleeping_op(commit_seconds))
    gate.set()
    for t in threads:
        t.join(30)


def test_writers_a_commit_answered_share_the_next_commit(tmp_path: Path) -> None:
    # Round 1: 8 writers queue behind a held writer and commit together, with
    # an op that makes that commit take 0.4 s (so the next may wait 0.4 s).
    # Round 2: each writer writes again as soon as it is answered; the first
    # to queue must not be committed alone: the writer waits for the others.
    with Store(StoreConfig(data_dir=tmp_path / "data", max_commit_delay_seconds=1.0)) as store:
        errors: list[BaseException] = []

        def writer(i: int) -> None:
            try:
                assert store.put(f"w{i}", b"\x08\x01").version == 1
                assert store.put(f"w{i}", b"\x08\x02").version == 2
            except BaseException as exc:
                errors.append(exc)

        _answered_together(
            store, [threading.Thread(target=writer, args=(i,)) for i in range(WRITERS)], commit_seconds=0.4
        )
        assert not errors, errors
        # [hold], [8 first writes + the slow op], then the 8 second writes in one commit.
        assert dict(store.counters.batch_sizes) == {1: 1, WRITERS + 1: 1, WRITERS: 1}
        assert store.counters.commit_delays >= 1
        assert all(store.get(f"w{i}").state == b"\x08\x02" for i in range(WRITERS))


def test_a_lone_writer_never_waits(tmp_path: Path) -> None:
    with Store(StoreConfig(data_dir=tmp_path / "data", max_commit_delay_seconds=1.0)) as store:
        submit_op(store, sleeping_op(0.2)).wait()  # a slow commit: a delay, were there one, could be 0.2 s
        for v in range(1, 31):
            assert store.put("alone", bytes([8, v])).version == v
        assert store.counters.commit_delays == 0
        assert store.counters.batch_sizes[1] == 31
        assert store.stats()["commit_delays"] == 0


def test_the_wait_lasts_past_the_last_commits_duration(tmp_path: Path) -> None:
    # 8 writers answered by a commit that took 0.4 s; then one writes alone.
    # The writer waits for the other 7 until three of that commit's durations
    # (at most max_commit_delay_seconds) have passed since it took that batch:
    # at least as long as the commit took (half of it cut off gathering 64
    # threads before the last had queued).
    with Store(StoreConfig(data_dir=tmp_path / "data", max_commit_delay_seconds=1.0)) as store:
        writers = [threading.Thread(target=store.put, args=(f"w{i}", b"\x08\x01")) for i in range(WRITERS)]
        _answered_together(store, writers, commit_seconds=0.4)
        delays, waited = store.counters.commit_delays, store.counters.commit_delay_seconds
        store.put("w0", b"\x08\x02")  # 8 writers expected; none else comes
        assert store.counters.commit_delays == delays + 1
        assert store.counters.commit_delay_seconds - waited >= 0.35


def test_put_many_is_one_writer(tmp_path: Path) -> None:
    # 1,050 writes from one put_many commit in batches of 100; the last (50)
    # is not held back for writers that never come (its caller waits for it).
    config = StoreConfig(data_dir=tmp_path / "data", max_commit_delay_seconds=1.0, max_batch_writes=100)
    with Store(config) as store:
        submit_op(store, sleeping_op(0.2)).wait()  # a slow commit: a delay, were there one, could be 0.2 s
        for round_ in range(3):
            results = store.put_many([PutRequest(f"s{i}", bytes([8, round_ + 1])) for i in range(1050)])
            assert [r.version for r in results if isinstance(r, PutResult)] == [round_ + 1] * 1050
        assert store.counters.commit_delays == 0


def test_no_delay_while_writers_wait_for_room(tmp_path: Path) -> None:
    # The backlog (max_queued_write_bytes) holds one 80-byte write: a second
    # writer waits for room, so it cannot queue however long the writer
    # would wait for it. The commit after the held one must not wait.
    config = StoreConfig(data_dir=tmp_path / "data", max_commit_delay_seconds=1.0, max_queued_write_bytes=100)
    with Store(config) as store:
        gate = hold_writer(store, then_seconds=0.4)  # a slow commit: the next may wait 0.4 s, were it to wait
        writers = [threading.Thread(target=store.put, args=(name, b"\x0a\x4e" + b"x" * 78)) for name in "ab"]
        writers[0].start()
        wait_queued(store, 1)
        writers[1].start()
        deadline = time.monotonic() + 10
        while room_waiters(store) < 1:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        gate.set()
        for t in writers:
            t.join(30)
        assert store.session("a").head_version == 1 and store.session("b").head_version == 1
        assert store.counters.commit_delays == 0


def test_no_delay_when_turned_off(tmp_path: Path) -> None:
    # Writers answered together, then one write alone: with the delay off it commits at once.
    with Store(StoreConfig(data_dir=tmp_path / "data", max_commit_delay_seconds=0)) as store:
        _answered_together(store, [threading.Thread(target=store.put, args=(f"s{i}", b"")) for i in range(4)])
        store.put("s0", b"\x08\x01")  # expected 4 writers; none else comes
        assert store.counters.commit_delays == 0


@pytest.mark.parametrize("seconds", [-0.001, 1.5])
def test_the_delay_is_bounded(tmp_path: Path, seconds: float) -> None:
    with pytest.raises(ValueError, match=rf"max_commit_delay_seconds must be in 0\.\.1, got {seconds}"):
        StoreConfig(data_dir=tmp_path, max_commit_delay_seconds=seconds)


def _commit_delays_of_a_sidecar_under_writers(sidecar: Sidecar, port: int) -> float:
    """8 clients each write 10 versions at once through a real sidecar; its ckpt_commit_delays_total."""

    def client(i: int) -> None:
        with CheckpointClient(sidecar.unix_target) as c:
            for v in range(10):
                c.put(f"c{i}", bytes([8, v + 1]))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    found = re.search(r"^ckpt_commit_delays_total (\S+)$", text, re.MULTILINE)
    assert found, text
    return float(found.group(1))


def test_ckpt_serve_takes_the_commit_delay_from_its_option_or_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    off_port, on_port = free_port(), free_port()
    off = start_sidecar(tmp_path / "off", "--max-commit-delay-seconds", "0", "--metrics-port", str(off_port))
    try:
        assert _commit_delays_of_a_sidecar_under_writers(off, off_port) == 0
    finally:
        assert off.stop() == 0
    monkeypatch.setenv("CKPT_MAX_COMMIT_DELAY_SECONDS", "0.5")
    on = start_sidecar(tmp_path / "on", "--metrics-port", str(on_port))
    try:
        assert _commit_delays_of_a_sidecar_under_writers(on, on_port) >= 1
    finally:
        assert on.stop() == 0


def test_ckpt_serve_names_a_commit_delay_out_of_range() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ckpt.sidecar.cli", "serve", "--max-commit-delay-seconds", "2"],
        capture_output=True,
        timeout=60,
    )
    assert out.returncode == 2 and b"--max-commit-delay-seconds must be in 0..1, got 2.0" in out.stderr, out.stderr


def test_commit_seconds_count_the_commits_not_the_writes_applied_before_them(tmp_path: Path) -> None:
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        assert store.counters.commit_seconds == 0.0 and store.stats()["commit_seconds"] == 0.0
        store.put("c", b"\x08\x01")
        first = store.counters.commit_seconds
        assert first > 0 and store.stats()["commit_seconds"] == first
        # An op whose apply sleeps a second, in the same batch as a put: the batch's time, not its commit's.
        gate = hold_writer(store)
        slow = submit_op(store, sleeping_op(1.0))
        later = put_later(store, PutRequest("c", b"\x08\x02"))
        wait_queued(store, 2)
        gate.set()
        slow.wait()
        assert later.result(30).version == 2
        assert store.counters.commits == 3  # the put, the held op, then the sleeping op and the put together
        assert first < store.counters.commit_seconds < first + 1.0
