"""Read-only opens beside a writer that grows the map (ckpt verify/stats/inspect beside a sidecar).

LMDB refuses a reader's transaction with MDB_MAP_RESIZED when another process
grew the map and wrote past the end the reader mapped. py-lmdb begins such
transactions while opening, so a tool opening a live sidecar's directory at the
wrong moment failed with "cannot be opened as an LMDB database" on a healthy
store (about one `ckpt verify` in forty beside a sidecar writing 64 KiB states).
The test puts the growth exactly in that window: a writer process grows the map
after the tool's environment is mapped and before it opens its tables.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import lmdb
import pytest

from ckpt.sidecar import Store, StoreConfig
from tests.support import ROOT

# A writer in another process: grows the map (1 MiB at first) by writing
# incompressible states past its end, as a busy sidecar does.
GROW_MAP = """
import os, sys
from pathlib import Path
from ckpt.sidecar import Store, StoreConfig
with Store(StoreConfig(data_dir=Path(sys.argv[1]), map_size_bytes=1 << 20)) as store:
    version = 0
    while store.counters.map_resizes < 2:
        version = store.put("grown", b"\\x0a\\x80\\x80\\x04" + os.urandom(65536)).version
    print(version)
"""


def grow_map_in_another_process(data_dir: Path) -> int:
    """The version the writer ended at, once it has grown the map twice."""
    done = subprocess.run(
        [sys.executable, "-c", GROW_MAP, str(data_dir)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def test_a_read_only_store_opens_when_a_writer_grows_the_map_during_its_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = tmp_path / "data"
    with Store(StoreConfig(data_dir=data_dir, map_size_bytes=1 << 20)) as store:
        store.put("before", b"\x0a\x01x")
    real_open = lmdb.open
    maps_bytes: list[int] = []  # the map size of each environment the store opened
    grown: list[int] = []

    def open_then_grow(path: str, **options: Any) -> lmdb.Environment:
        env = real_open(path, **options)
        if options.get("max_dbs"):  # the store's own open, not the truncation check (max_dbs=0)
            maps_bytes.append(env.info()["map_size"])
            if not grown:
                grown.append(grow_map_in_another_process(data_dir))
        return env

    monkeypatch.setattr(lmdb, "open", open_then_grow)
    # A 1 MiB map: the default (256 MiB) would have room for the writer's growth.
    with Store(StoreConfig(data_dir=data_dir, map_size_bytes=1 << 20), readonly=True) as reader:
        assert reader.get("before").state == b"\x0a\x01x"
        assert reader.get("grown").version == grown[0]
    # The first environment mapped the map as it was; the store opened again at the grown size.
    assert len(maps_bytes) == 2 and maps_bytes[0] == 1 << 20 < maps_bytes[1], maps_bytes


def test_a_shared_writable_store_opens_when_another_process_grows_the_map_during_its_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's store process (``--workers``) opens writable and shared beside the other workers'; one of
    those growing the map in that window made the worker exit "cannot be opened as an LMDB database", and
    with it the whole sidecar, when started again under load."""
    data_dir = tmp_path / "data"
    with Store(StoreConfig(data_dir=data_dir, map_size_bytes=1 << 20)) as store:
        store.put("before", b"\x0a\x01x")
    real_open = lmdb.open
    maps_bytes: list[int] = []
    grown: list[int] = []

    def open_then_grow(path: str, **options: Any) -> lmdb.Environment:
        env = real_open(path, **options)
        if options.get("max_dbs"):
            maps_bytes.append(env.info()["map_size"])
            if not grown:
                grown.append(grow_map_in_another_process(data_dir))
        return env

    monkeypatch.setattr(lmdb, "open", open_then_grow)
    with Store(StoreConfig(data_dir=data_dir, map_size_bytes=1 << 20), shared=True, sweeper=False) as worker:
        assert worker.get("grown").version == grown[0]
        assert worker.put("after", b"\x0a\x01y").version == 1
    assert len(maps_bytes) == 2 and maps_bytes[0] == 1 << 20 < maps_bytes[1], maps_bytes
