"""A store process killed (SIGKILL) under AppendEvents-with-put loses nothing acknowledged, and leaves no
event without its checkpoint nor a checkpoint without its events: both are one transaction."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path

from ckpt.bench.output import child_pids
from ckpt.sidecar import EventQuery, Store, StoreConfig
from ckpt.sidecar.client import CheckpointClient, CheckpointError, event
from ckpt.v1 import checkpoint_pb2 as pb
from ckpt.v1 import service_pb2
from tests.support import ckpt, start_sidecar

EVENTS_PER_STEP = 3
WRITERS = 6


def step_patch(version: int) -> bytes:
    return pb.Checkpoint(step=version).SerializeToString()


def test_sigkill_during_appends_with_puts_keeps_both_halves_of_every_step(tmp_path: Path) -> None:
    data = tmp_path / "data"
    sidecar = start_sidecar(data)
    acked = dict.fromkeys(range(WRITERS), 0)
    enough = threading.Event()
    lock = threading.Lock()

    def agent(n: int) -> None:
        with CheckpointClient(sidecar.unix_target, retries=0, timeout_seconds=20) as client:
            version = 0
            with contextlib.suppress(CheckpointError):
                while True:
                    version += 1
                    client.append_events(
                        f"a{n}",
                        [event("step", b"%d/%d" % (version, i)) for i in range(EVENTS_PER_STEP)],
                        put=service_pb2.PutRequest(
                            state=step_patch(version), mode=service_pb2.WRITE_MODE_MERGE, expected_version=version - 1
                        ),
                    )
                    with lock:
                        acked[n] = version
                        if sum(acked.values()) >= 300:
                            enough.set()

    threads = [threading.Thread(target=agent, args=(n,), daemon=True) for n in range(WRITERS)]
    for t in threads:
        t.start()
    assert enough.wait(60), sidecar.log()
    store_process = next(
        pid for pid in child_pids(sidecar.pid) if b"storehost" in Path(f"/proc/{pid}/cmdline").read_bytes()
    )
    os.kill(store_process, signal.SIGKILL)  # mid-load: appends are under way in every thread
    assert sidecar.process.wait(timeout=30) == 1, sidecar.log()
    for t in threads:
        t.join(30)
    with Store(StoreConfig(data_dir=data, sweep_interval_seconds=3600)) as store:
        for n, top in acked.items():
            session = f"a{n}"
            head = store.session(session).head_version
            assert head >= top, f"{session}: acknowledged version {top} lost (head {head})"
            assert store.get(session).state == b"".join(step_patch(v) for v in range(1, head + 1))
            events = store.read_events(session, EventQuery(page_size=1000)).events
            # Exactly the events of the versions committed: none of a lost step, none missing from a kept one.
            assert [(e.seq, e.payload) for e in events] == [
                (EVENTS_PER_STEP * (v - 1) + i + 1, b"%d/%d" % (v, i))
                for v in range(1, head + 1)
                for i in range(EVENTS_PER_STEP)
            ]
    verify = ckpt("verify", "--data-dir", str(data))
    assert verify.returncode == 0, verify.stderr
