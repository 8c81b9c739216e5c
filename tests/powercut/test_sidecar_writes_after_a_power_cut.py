"""A power cut keeps every write the sidecar acknowledged: checkpoints, events and blobs written by four
clients at once, the sidecar and its store process killed at a moment of their writes, and the disk read
back as the cut may have left it (what was flushed, and that with a random part of what was not: see
image.py). Under --durability no-meta-sync the same
cut undoes the last commit, as documented: the disk the test rebuilds is one that a missing flush shows on."""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ckpt.bench.output import child_pids
from ckpt.sidecar.client import CheckpointClient, CheckpointError, NotFoundError, event
from ckpt.sidecar.server.process import start_sidecar_process
from ckpt.v1 import service_pb2
from tests.powercut.image import PowerCut, verified
from tests.support import Sidecar, free_port, start_sidecar

WRITERS = 4


@dataclass
class Acknowledged:
    """What the sidecar acknowledged, as each call returned."""

    states: dict[tuple[str, int], str] = field(default_factory=dict)  # (session, version): SHA-256
    events: dict[tuple[str, int], bytes] = field(default_factory=dict)  # (session, seq): payload
    blobs: dict[str, str] = field(default_factory=dict)  # SHA-256: the session storing it
    lock: threading.Lock = field(default_factory=threading.Lock)

    def forget(self, sid: str) -> None:
        """``sid`` is being deleted: its writes may be gone from now on, whether the delete lands or not."""
        for key in [k for k in self.states if k[0] == sid]:
            del self.states[key]
        for key in [k for k in self.events if k[0] == sid]:
            del self.events[key]
        for sha in [sha for sha, s in self.blobs.items() if s == sid]:
            del self.blobs[sha]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write(target: str, writer: int, acked: Acknowledged, stop: threading.Event) -> None:
    """Puts, appends with a put, now and then a blob or a session deleted (its blobs then swept), on this
    writer's sessions, until the sidecar is gone."""
    rng = random.Random(writer)
    with CheckpointClient(target, retries=0, timeout_seconds=10) as client:
        step = 0
        while not stop.is_set():
            sid = f"w{writer}-{step % 3}"
            state = rng.randbytes(rng.choice((40, 900, 6000, 40000)))
            try:
                if step % 4 == 3:
                    payload = rng.randbytes(rng.randrange(1, 3000))
                    reply = client.append_events(sid, [event("note", payload)], put=service_pb2.PutRequest(state=state))
                    with acked.lock:
                        acked.events[(sid, reply.last_seq)] = payload
                        acked.states[(sid, reply.put.version)] = _sha(state)
                elif step % 11 == 5:
                    data = rng.randbytes(rng.choice((70_000, 400_000)))
                    ref = client.put_blob(data, session_id=sid)
                    with acked.lock:
                        acked.blobs[ref.uri.rsplit(":", 1)[1]] = sid
                elif step % 17 == 8:
                    with acked.lock:
                        acked.forget(sid)
                    client.delete(sid)
                else:
                    version = client.put(sid, state).version
                    with acked.lock:
                        acked.states[(sid, version)] = _sha(state)
            except CheckpointError:
                return  # the sidecar is gone
            step += 1


def _cut(sidecar: Sidecar) -> None:
    """The power goes: the sidecar and every process under it (workers, store processes) end at once."""
    pids, at = [sidecar.pid], 0
    while at < len(pids):
        pids += child_pids(pids[at])
        at += 1
    for pid in reversed(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    sidecar.process.wait(timeout=20)


def _start_recorded(cut: PowerCut, *extra: str, cut_at_step: int = 0, workers: int = 1) -> Sidecar:
    tcp = f"127.0.0.1:{free_port()}"
    # --workers N serves TCP alone, each worker with a store process of its own writing the one store.
    listen = [f"unix:{cut.watched.parent}/recorded.sock", tcp] if workers == 1 else [tcp]
    env = {**cut.env(), "POWERCUT_AT_STEP": str(cut_at_step)}
    p = start_sidecar_process(
        cut.watched,
        *extra,
        "--workers",
        str(workers),
        listen=listen,
        log_path=cut.watched.parent / "recorded.log",
        env=env,
    )
    return Sidecar(p.process, p.data_dir, p.targets, p.log_path)


def _holds(
    image: Path, states: dict[tuple[str, int], str], events: dict[tuple[str, int], bytes], blobs: Iterable[str]
) -> None:
    """``image`` verifies clean, and a sidecar started on it reads back each write in ``states``, ``events``
    and ``blobs`` as acknowledged."""
    verified(image)
    restarted = start_sidecar(image)
    try:
        with CheckpointClient(restarted.unix_target) as client:
            for (sid, version), sha in states.items():
                assert _sha(client.get(sid, version).state) == sha, (image, sid, version)
            for sid in {s for s, _ in events}:
                stored = {e.seq: e.payload for e in client.events(sid)}
                for (s, seq), payload in events.items():
                    if s == sid:
                        assert stored.get(seq) == payload, (image, sid, seq)
            for sha in blobs:
                assert _sha(b"".join(client.get_blob(sha))) == sha, (image, sha)
    finally:
        assert restarted.stop() == 0, restarted.log()


def _written_and_cut(cut: PowerCut, cut_at_step: int, *extra: str, workers: int = 1) -> Acknowledged:
    """Four writers on a sidecar recorded by ``cut``, until it is cut at that step: what it acknowledged."""
    # Swept often: the files of blobs whose sessions were deleted go while the writes go on.
    sidecar = _start_recorded(cut, "--sweep-interval-seconds", "0.3", *extra, cut_at_step=cut_at_step, workers=workers)
    acked, stop = Acknowledged(), threading.Event()
    target = sidecar.targets[0]
    writers = [threading.Thread(target=_write, args=(target, w, acked, stop)) for w in range(WRITERS)]
    for w in writers:
        w.start()
    try:
        sidecar.process.wait(timeout=120)  # cut at that step: every process of the sidecar is killed
    finally:
        _cut(sidecar)
        stop.set()
        for w in writers:
            w.join(timeout=30)
    return acked


@pytest.mark.parametrize(("cut_at_step", "workers"), [(60, 1), (250, 1), (900, 1), (2500, 1), (700, 2), (2000, 2)])
def test_every_acknowledged_write_is_on_each_disk_a_power_cut_may_leave(
    tmp_path: Path, powercut_library: Path, cut_at_step: int, workers: int
) -> None:
    cut = PowerCut.make(powercut_library, tmp_path / "data", tmp_path / "shadow")
    acked = _written_and_cut(cut, cut_at_step, workers=workers)
    # Every answer came before the cut: no write is acknowledged before its commit is on disk.
    states, events, blobs = acked.states, acked.events, acked.blobs
    # What was flushed alone, then three disks keeping besides a random part of what was not.
    _holds(cut.rebuild(tmp_path / "flushed" / "data"), states, events, blobs)
    for seed in range(3):
        _holds(cut.rebuild(tmp_path / f"more-{seed}" / "data", rng=random.Random(seed)), states, events, blobs)


@pytest.mark.parametrize("cut_at_step", [300, 1200])
def test_without_meta_sync_each_disk_a_power_cut_may_leave_verifies(
    tmp_path: Path, powercut_library: Path, cut_at_step: int
) -> None:
    """Commits undone, never a damaged store: no record names a blob file already removed."""
    cut = PowerCut.make(powercut_library, tmp_path / "data", tmp_path / "shadow")
    acked = _written_and_cut(cut, cut_at_step, "--durability", "no-meta-sync")
    assert acked.states
    verified(cut.rebuild(tmp_path / "flushed" / "data"))
    for seed in range(2):
        verified(cut.rebuild(tmp_path / f"more-{seed}" / "data", rng=random.Random(seed)))


def test_without_meta_sync_the_cut_undoes_the_last_commit(tmp_path: Path, powercut_library: Path) -> None:
    cut = PowerCut.make(powercut_library, tmp_path / "data", tmp_path / "shadow")
    sidecar = _start_recorded(cut, "--durability", "no-meta-sync")
    states = [f"state {n}".encode() * 50 for n in range(1, 21)]
    with CheckpointClient(sidecar.unix_target) as client:
        versions = [client.put("s", state).version for state in states]
        time.sleep(0.3)  # nothing in flight: the last commit is acknowledged and alone unflushed
        _cut(sidecar)
    image = cut.rebuild(tmp_path / "after" / "data")
    verified(image)
    restarted = start_sidecar(image)
    try:
        with CheckpointClient(restarted.unix_target) as client:
            with pytest.raises(NotFoundError):
                client.get("s", versions[-1])
            head = client.get("s")
            assert head.version == versions[-2]
            for version, state in zip(versions[:-1], states[:-1], strict=True):
                assert client.get("s", version).state == state
    finally:
        assert restarted.stop() == 0, restarted.log()
