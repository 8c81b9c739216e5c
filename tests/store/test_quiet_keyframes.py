"""Quiet keyframes (keyframe_after_quiet_seconds): a session that stopped writing gets its head
rewritten as a FULL frame of the same state, so the cold read that resumes it decodes one frame."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ckpt.bench import synthetic
from ckpt.codec import ChainEncoder, FrameKind, decode, keyframe, parse
from ckpt.codec.errors import EncodeError
from ckpt.sidecar import PutRequest, Retention, Store, StoreConfig, WriteMode
from ckpt.sidecar.client import CheckpointClient
from ckpt.sidecar.store.keyframes import Planned, QuietSweep
from ckpt.sidecar.store.layout import FRAMES_LAYOUT
from ckpt.v1 import service_pb2
from tests.store.support import (
    every_version,
    kinds,
    layout_stamp,
    put_later,
    storage_of,
    wait_queued,
    writer_held,
)
from tests.support import ROOT, start_sidecar_sweeping

QUIET_SECONDS = 60.0
FULL = service_pb2.FRAME_KIND_FULL
LATER = int((QUIET_SECONDS + 5) * 1e9)  # a sweep this far after the writes finds them quiet


def replace_states(seed: int, steps: int = 14) -> list[bytes]:
    return [s.state for s in synthetic.session(seed, steps=steps, memory_keys=12, plan_steps=8)]


def merge_patches(seed: int, steps: int = 14) -> list[bytes]:
    return [s.patch for s in synthetic.session(seed, steps=steps, memory_keys=12, plan_steps=8)]


@pytest.fixture
def config(tmp_path: Path) -> StoreConfig:
    # Folding off: a MERGE session's PATCH head is keyframed as before (with folding on, it is folded:
    # test_folds.py).
    return StoreConfig(
        data_dir=tmp_path / "data",
        keyframe_after_quiet_seconds=QUIET_SECONDS,
        fold_after_quiet_seconds=None,
        sweep_interval_seconds=3600,
    )


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The wall clock the store reads (time.time_ns), as ``[nanoseconds]`` for the test to set."""
    now = [time.time_ns()]
    monkeypatch.setattr(time, "time_ns", lambda: now[0])
    return now


# -- the codec's part ----------------------------------------------------------


def test_keyframe_is_a_full_frame_of_the_state_at_the_given_version() -> None:
    enc = ChainEncoder()
    states = replace_states(1, steps=6)
    frames = [enc.replace(s) for s in states]
    assert frames[-1].kind is FrameKind.DELTA
    frame = keyframe(states[-1], version=6)
    header, _ = parse(frame.data)
    assert (header.kind, header.version, header.base_version) == (FrameKind.FULL, 6, 0)
    assert header.state_xxh3 == frames[-1].header.state_xxh3  # the same state, checksum and all
    assert decode([frame.data]) == states[-1]
    # An encoder resumed from it continues the session with a new chain stream.
    resumed = ChainEncoder.resume(states[-1], [header])
    nxt = resumed.replace(states[-1] + b"\x08\x07")
    assert decode([frame.data, nxt.data]) == states[-1] + b"\x08\x07"


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"version": 0}, ValueError, "version must be >= 1, got 0"),
        ({"version": True}, TypeError, "version must be an int, not bool"),
        ({"version": 1.0}, TypeError, "version must be an int, not float"),
    ],
)
def test_keyframe_rejects_misuse(kwargs: dict[str, object], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        keyframe(b"state", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="state must be bytes, not str"):
        keyframe("state", version=1)  # type: ignore[arg-type]
    assert not issubclass(error, EncodeError)


# -- the store ---------------------------------------------------------------------


def test_config_rejects_a_quiet_period_that_is_not_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"keyframe_after_quiet_seconds must be > 0 or None, got 0"):
        StoreConfig(data_dir=tmp_path, keyframe_after_quiet_seconds=0)


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("keyframe_after_quiet_seconds", lambda d, s: StoreConfig(data_dir=d, keyframe_after_quiet_seconds=s)),
        ("request_id_ttl_seconds", lambda d, s: StoreConfig(data_dir=d, request_id_ttl_seconds=s)),
        ("sweep_interval_seconds", lambda d, s: StoreConfig(data_dir=d, sweep_interval_seconds=s)),
        ("max_version_age_seconds", lambda d, s: Retention(keep_last_versions=2, max_version_age_seconds=s)),
    ],
)
def test_config_refuses_durations_past_100_years_and_nan(
    tmp_path: Path, name: str, make: Callable[[Path, float], object]
) -> None:
    """inf or NaN made every sweep fail or skip each session, and an infinite request id TTL every put."""
    with pytest.raises(ValueError) as info:
        make(tmp_path, 3153600000.5)
    assert str(info.value) == f"{name} must be at most 3153600000 seconds (100 years), got 3153600000.5"
    for seconds in (float("inf"), float("nan")):
        with pytest.raises(ValueError) as info:
            make(tmp_path, seconds)
        assert str(info.value) == f"{name} must be a finite number of seconds, got {seconds}"
    make(tmp_path, 3153600000)  # 100 years is allowed


@pytest.mark.parametrize("mode", [WriteMode.REPLACE, WriteMode.MERGE])
def test_a_quiet_session_gets_a_full_head_and_every_version_still_reads_back(
    config: StoreConfig, mode: WriteMode
) -> None:
    if mode is WriteMode.REPLACE:
        writes = replace_states(2)
        expected = writes
    else:
        writes = merge_patches(2)
        expected = [b"".join(writes[: i + 1]) for i in range(len(writes))]
    with Store(config) as store:
        for w in writes:
            store.put("s", w, mode=mode)
        before = kinds(store, "s")
        assert before[-1] is not FrameKind.FULL, before
        assert store.sweep(now_nanos=time.time_ns() + LATER).keyframes_written == 1
        after = kinds(store, "s")
        assert after == [*before[:-1], FrameKind.FULL]  # only the head's frame changed
        assert every_version(store, "s") == expected
        info = store.session("s")
        assert info.stored_bytes == sum(v.stored_bytes for v in store.list_versions("s")[0])
        assert store.get("s").info.frame_kind is FrameKind.FULL  # the cached head's metadata too
        # The next write starts a chain on the keyframe (not the old chain's zstd stream).
        nxt = writes[-1] + b"\x08\x05" if mode is WriteMode.REPLACE else b"\x08\x05"
        store.put("s", nxt, mode=mode)
        expected = [*expected, expected[-1] + b"\x08\x05"]
        assert kinds(store, "s")[-2:] == [
            FrameKind.FULL,
            FrameKind.PATCH if mode is WriteMode.MERGE else FrameKind.DELTA,
        ]
        assert every_version(store, "s") == expected
        # Sweeping again finds it already keyframed, or not yet quiet.
        assert store.sweep(now_nanos=time.time_ns()).keyframes_written == 0
    with Store(config) as store:  # reopened: encoders are rebuilt from LMDB
        store.put("s", expected[-1] + b"\x08\x06" if mode is WriteMode.REPLACE else b"\x08\x06", mode=mode)
        assert every_version(store, "s") == [*expected, expected[-1] + b"\x08\x06"]


def test_a_quiet_keyframe_stamps_the_layout_that_reads_sealed_frames(config: StoreConfig) -> None:
    """A keyframe is a sealed FULL frame (FORMAT.md), which a ckpt of layout 6 cannot read: its commit stamps 7."""
    with Store(config) as store:
        for s in replace_states(5):
            store.put("s", s)
    assert layout_stamp(config.data_dir) == b"6"  # a store never rewritten stays openable by layout 6
    with Store(config) as store:
        assert store.sweep(now_nanos=time.time_ns() + LATER).keyframes_written == 1
    assert layout_stamp(config.data_dir) == str(FRAMES_LAYOUT).encode() == b"7"


def test_sessions_written_within_the_quiet_period_are_left_alone(config: StoreConfig) -> None:
    with Store(config) as store:
        for s in replace_states(3):
            store.put("recent", s)
        before = kinds(store, "recent")
        assert store.sweep(now_nanos=time.time_ns() + int((QUIET_SECONDS - 5) * 1e9)).keyframes_written == 0
        assert kinds(store, "recent") == before


def test_many_quiet_sessions_are_keyframed_in_one_sweep_and_only_once(config: StoreConfig) -> None:
    with Store(config) as store:
        expected = {}
        for i in range(40):
            states = replace_states(100 + i, steps=5 + i % 7)
            for s in states:
                store.put(f"s{i:02d}", s)
            expected[f"s{i:02d}"] = states
        needing = sum(kinds(store, sid)[-1] is not FrameKind.FULL for sid in expected)
        assert needing > 20
        assert store.sweep(now_nanos=time.time_ns() + LATER).keyframes_written == needing
        assert store.sweep(now_nanos=time.time_ns() + LATER).keyframes_written == 0
        for sid, states in expected.items():
            assert kinds(store, sid)[-1] is FrameKind.FULL
            assert every_version(store, sid) == states


def test_a_restarted_store_resumes_the_sweep_where_it_stopped(
    config: StoreConfig, clock: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep's bound is kept in the store: after a restart, the index entries below it are not read
    again (the first sweep of a process read the whole index), and a session written since is keyframed."""
    start = clock[0]
    with Store(config) as store:
        for i in range(40):
            for s in replace_states(200 + i, steps=6):
                store.put(f"s{i:02d}", s)
        needing = sum(kinds(store, f"s{i:02d}")[-1] is not FrameKind.FULL for i in range(40))
        clock[0] = start + 5 * 10**9  # the writes' index granule is behind the present
        assert store.sweep(now_nanos=start + LATER).keyframes_written == needing > 20
    looked: list[bytes] = []
    with Store(config) as store:
        # A private hook: which sessions a sweep reads from the index shows only at its keyframe plans.
        keyframe_plan = QuietSweep.plan

        def counting(self: QuietSweep, sids: list[bytes], quiet_since: int) -> tuple[list[Planned], int]:
            looked.extend(sids)
            return keyframe_plan(self, sids, quiet_since)

        monkeypatch.setattr(QuietSweep, "plan", counting)
        clock[0] = start + 10 * 10**9
        for s in replace_states(300, steps=6):
            store.put("late", s)
        clock[0] = start + 20 * 10**9
        assert store.sweep(now_nanos=clock[0] + LATER).keyframes_written == 1
        assert kinds(store, "late")[-1] is FrameKind.FULL
    assert looked == [b"late"]


def test_a_clock_step_no_sweep_sees_is_caught_by_the_writes_it_makes_across_a_restart(
    tmp_path: Path, clock: list[int]
) -> None:
    """The clock steps back 45 s (more than the 30 s quiet period, less than a sweep interval), a session
    is written below the kept bound, and the store restarts before any sweep: it is still keyframed,
    not left for its next write."""
    config = StoreConfig(data_dir=tmp_path / "data", keyframe_after_quiet_seconds=30, sweep_interval_seconds=3600)
    start = clock[0]
    with Store(config) as store:
        for s in replace_states(1, steps=6):
            store.put("a", s)
        clock[0] = start + 100 * 10**9
        assert store.sweep().keyframes_written == 1  # the bound: ~70 s after start
        clock[0] = start + 55 * 10**9  # stepped back
        for s in replace_states(2, steps=6):
            store.put("x", s)
        assert kinds(store, "x")[-1] is not FrameKind.FULL
    clock[0] = start + 200 * 10**9
    with Store(config) as store:
        assert store.sweep().keyframes_written == 1
        assert kinds(store, "x")[-1] is FrameKind.FULL


def test_idle_sweeps_commit_nothing(config: StoreConfig, clock: list[int]) -> None:
    """Keeping the sweep's bound commits only when a sweep read index entries: an idle store with quiet
    keyframes on makes no durable commit per sweep."""
    with Store(config) as store:
        for s in replace_states(3, steps=6):
            store.put("a", s)
        clock[0] += LATER
        assert store.sweep().keyframes_written == 1
        # A private hook: LMDB's last transaction id, which a commit that writes nothing leaves as it is
        # (store.counters.commits counts every write transaction, each sweep's request-id expiry among them).
        env = storage_of(store).env
        txn_id = env.info()["last_txnid"]
        for _ in range(3):
            clock[0] += 60 * 10**9
            assert store.sweep().keyframes_written == 0
        assert env.info()["last_txnid"] == txn_id


def test_a_keyframe_committed_before_a_write_to_its_session_ends_that_writes_stream(config: StoreConfig) -> None:
    """A keyframe and the write after it share one group commit: the write's frame starts a stream after the
    FULL frame.

    The write's encoder, continuing the old chain's zstd stream, went back into
    the encoder cache after such a commit, so the writes after the new FULL frame
    continued a stream it does not start: cold reads of them decoded garbage or
    failed (DataLoss) for some states. For the head to count as quiet, the sweep
    runs ahead of the clock, as a wall clock that steps back makes it.
    """
    states = replace_states(7, steps=12)
    with Store(config) as store:
        for state in states[:4]:  # versions 1-4
            store.put("s", state)
        with writer_held(store):
            # A private hook: the sweep's keyframe pass alone. A whole sweep queues its request-id
            # expiry first, which would commit before the keyframe op.
            keyframing = threading.Thread(target=store._quiet.keyframes.sweep, args=(time.time_ns() + LATER,))
            keyframing.start()
            wait_queued(store, 1)  # the keyframe op of version 4, planned while the writer was held
            v5 = put_later(store, PutRequest("s", states[4]))
            wait_queued(store, 2)
        assert v5.result(timeout=10).version == 5
        keyframing.join(10)
        assert store.stats()["batch_sizes"].get(2) == 1  # the two shared a commit
        for state in states[5:]:
            store.put("s", state)
        assert kinds(store, "s")[3:5] == [FrameKind.FULL, FrameKind.DELTA]  # the keyframe of version 4, then v5
        _, frames = store.frames_of("s")
        assert not parse(frames[4][2])[0].continues_stream  # version 5 starts a stream after the FULL frame
        assert every_version(store, "s") == states
    with Store(config) as reopened:
        assert every_version(reopened, "s") == states


def test_a_keyframe_planned_before_a_write_to_its_session_is_not_written_over_it(
    config: StoreConfig, clock: list[int]
) -> None:
    """A rewrite is planned from the committed head, off the writer; a write to the session committed
    between the plan and its op (here: first in their shared commit) moves the record on, so the op
    leaves the session alone and the write's version stands, until the session is quiet again."""
    # The clock stands still: every write is stamped 1 ns after the last, in one granule of the updated-time
    # index. On a moving clock, a write landing in the next granule moves the session's entry past where
    # the sweep has read, which it then reads again and, quiet by the sweep's time, keyframes.
    states = replace_states(8, steps=8)
    with Store(config) as store:
        for state in states[:4]:
            store.put("s", state)
        with writer_held(store):
            v5 = put_later(store, PutRequest("s", states[4]))
            wait_queued(store, 1)
            done: list[int] = []
            keyframing = threading.Thread(
                target=lambda: done.append(store._quiet.keyframes.sweep(time.time_ns() + LATER))
            )
            keyframing.start()
            wait_queued(store, 2)  # the write, then the keyframe op planned from version 4
        assert v5.result(timeout=10).version == 5
        keyframing.join(10)
        assert done == [0]
        assert store.stats()["batch_sizes"].get(2) == 1
        assert kinds(store, "s")[3:5] == [FrameKind.DELTA, FrameKind.DELTA]  # neither rewritten
        assert every_version(store, "s") == states[:5]
        assert store.sweep(now_nanos=time.time_ns() + LATER).keyframes_written == 1  # quiet again: version 5
        assert kinds(store, "s")[4] is FrameKind.FULL
        for state in states[5:]:
            store.put("s", state)
        assert every_version(store, "s") == states
    with Store(config) as reopened:
        assert every_version(reopened, "s") == states


def test_sessions_written_after_the_clock_steps_back_are_still_keyframed(
    config: StoreConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep scans from the last sweep's bound; after a step back, writes index below it. They are stamped
    after the writes before them (the store's times never go backwards), so they are quiet once the sweep's
    time is past theirs by the quiet period, while the wall clock is still behind."""
    stepped_back_nanos = 0
    real_time_ns = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() - stepped_back_nanos)
    states = replace_states(3, steps=5)
    with Store(config) as store:
        for state in states:
            store.put("before", state)
        assert store.sweep(now_nanos=real_time_ns() + LATER).keyframes_written == 1
        stepped_back_nanos = 3600 * 10**9  # NTP steps the clock back an hour
        for state in states:
            store.put("after", state)
        assert kinds(store, "after")[-1] is FrameKind.DELTA
        assert store.sweep(now_nanos=real_time_ns() + LATER).keyframes_written == 1
        assert kinds(store, "after")[-1] is FrameKind.FULL
        assert every_version(store, "after") == states


def test_retention_can_drop_the_chain_a_keyframe_ended(tmp_path: Path) -> None:
    config = StoreConfig(
        data_dir=tmp_path / "data",
        keyframe_after_quiet_seconds=QUIET_SECONDS,
        retention=Retention(keep_last_versions=1),
        sweep_interval_seconds=3600,
    )
    states = replace_states(4)
    with Store(config) as store:
        for s in states:
            store.put("s", s)
        store.sweep(now_nanos=time.time_ns() + LATER)  # keyframes (retention ran first: it kept the chain)
        store.sweep(now_nanos=time.time_ns() + LATER)  # now the head starts its own chain
        info = store.session("s")
        assert (info.first_version, info.version_count) == (len(states), 1)
        assert store.get("s", use_cache=False).state == states[-1]


def test_ckpt_verify_accepts_a_keyframed_store(config: StoreConfig) -> None:
    with Store(config) as store:
        for s in replace_states(5):
            store.put("a", s)
        for p in merge_patches(6):
            store.put("b", p, mode=WriteMode.MERGE)
        assert store.sweep(now_nanos=time.time_ns() + LATER).keyframes_written == 2
    done = subprocess.run(
        [sys.executable, "-m", "ckpt.sidecar.cli", "verify", "--data-dir", str(config.data_dir)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_sidecar_keyframes_sessions_that_went_quiet(tmp_path: Path) -> None:
    sidecar = start_sidecar_sweeping(tmp_path / "data", 0.2, "--keyframe-after-quiet-seconds", "1")
    try:
        states = replace_states(7)
        with CheckpointClient(sidecar.unix_target) as client:
            for s in states:
                client.put("agent", s)
            assert next(client.history("agent")).frame_kind == service_pb2.FRAME_KIND_DELTA
            deadline = time.monotonic() + 15
            while next(client.history("agent")).frame_kind != FULL and time.monotonic() < deadline:
                time.sleep(0.1)
            history = list(client.history("agent"))
            assert history[0].frame_kind == FULL, history[0]
            assert [v.frame_kind for v in history[1:]].count(FULL) < len(history) - 1  # only the head changed
            assert [client.get("agent", v).state for v in range(1, len(states) + 1)] == states
            client.put("agent", states[-1] + b"\x08\x09")
            assert client.get("agent").state == states[-1] + b"\x08\x09"
    finally:
        assert sidecar.stop() == 0
