"""A process killed inside an LMDB read transaction does not pin a snapshot for good.

Other processes read a live store's directory: the sidecar's gRPC process
(its reply cache reads heads) and read-only tools. LMDB clears the reader
slots of dead processes when a store opens; a store that stays open clears
them before every sweep.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from sidecar.config import StoreConfig
from sidecar.store import Store

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
    table = store._env.readers()  # "    pid     thread     txnid" then one line per slot
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
