"""A process killed inside an LMDB read transaction does not pin a snapshot for good.

Other processes read a live store's directory: the sidecar's gRPC process
(its reply cache reads heads) and read-only tools. LMDB clears the reader
slots of dead processes when a store opens; a store that stays open clears
them before every sweep, and as soon as the file grows.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckpt.sidecar.config import StoreConfig
from ckpt.sidecar.storage import lmdb_storage
from ckpt.sidecar.store import Store
from tests.store.support import storage_of

# A reader that opens the store's LMDB read-only, begins a read transaction and waits to be killed.
_READER = """
import sys, lmdb
env = lmdb.open(sys.argv[1], readonly=True, max_dbs=8)
txn = env.begin()
print("reading", flush=True)
sys.stdin.read()
"""


def _kill_a_reader_mid_transaction(lmdb_dir: Path) -> int:
    with subprocess.Popen(
        [sys.executable, "-c", _READER, str(lmdb_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as reader:
        assert reader.stdout is not None and reader.stdout.readline() == "reading\n"
        reader.send_signal(signal.SIGKILL)
        reader.wait()
    return reader.pid


def _reader_pids(store: Store) -> set[int]:
    table = storage_of(store).readers()  # "    pid     thread     txnid" then one line per slot
    return {int(line.split()[0]) for line in table.splitlines()[1:] if line.strip()}


def test_the_sweeper_frees_a_dead_readers_slot(tmp_path: Path) -> None:
    with Store(StoreConfig(data_dir=tmp_path, sweep_interval_seconds=0.2)) as store:
        store.put("s", b"\x08\x01")
        dead = _kill_a_reader_mid_transaction(tmp_path / "lmdb")
        assert dead in _reader_pids(store)  # its slot outlived it
        deadline = time.monotonic() + 10
        while dead in _reader_pids(store):
            assert time.monotonic() < deadline, "the sweeper never cleared the dead reader's slot"
            time.sleep(0.05)
        assert store.get("s").state == b"\x08\x01"


def test_a_growing_file_frees_a_dead_readers_slot_before_the_next_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The slot pins its snapshot: every page written after it is new, so under
    # a steady churn the file grew by everything written until the next sweep
    # (a minute by default; a 104 MB data.mdb reached 2.8 GB in one such wait).
    # The writer looks once the file grows (here at every growth, not at most
    # once a second): no sweep runs in this test.
    # A private hook: how often the file's growth may look is a constant of the LMDB storage.
    monkeypatch.setattr(lmdb_storage, "READER_CHECK_INTERVAL_SECONDS", 0.0)
    with Store(StoreConfig(data_dir=tmp_path, sweep_interval_seconds=3600)) as store:
        store.put("s", b"\x08\x01")
        dead = _kill_a_reader_mid_transaction(tmp_path / "lmdb")
        assert dead in _reader_pids(store)
        used = store.stats()["used_bytes"]
        for i in range(64):  # grows the file: a page per state at least, none reusable under the pin
            store.put(f"s{i}", bytes([i]) * 8192)
        assert store.stats()["used_bytes"] > used
        assert dead not in _reader_pids(store)
        # Once freed, what the writes free is reused: ten more rounds of rewriting the same sessions
        # add less than one round's states (pinned, each round added all of them).
        settled = store.stats()["used_bytes"]
        for n in range(10):
            for i in range(64):
                store.put(f"s{i}", bytes([i + n]) * 8192)
        assert store.stats()["used_bytes"] - settled < 64 * 8192
