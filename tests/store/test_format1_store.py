"""A store written before frame format 2 (format 1 frames, store layout 2) opens, serves and takes writes.

tests/store/fixtures/format1_store.tar.gz was written by the last build that
wrote format 1 (fixtures/write_format1_store.py, which also wrote the manifest
of every version's size and xxh3). This build must read every version of it
as written, with no manual step, append to its chains, and serve it.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
import xxhash

from ckpt.sidecar import Store, StoreConfig, WriteMode
from ckpt.sidecar.client import CheckpointClient
from tests.support import ckpt, start_sidecar

FIXTURE = Path(__file__).parent / "fixtures" / "format1_store.tar.gz"


@pytest.fixture
def format1_dir(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(data, filter="data")
    return data


def _manifest(data: Path) -> dict[str, list[list[int]]]:
    manifest: dict[str, list[list[int]]] = json.loads((data / "manifest.json").read_text())
    return manifest


def _digest(state: bytes) -> list[int]:
    return [len(state), xxhash.xxh3_64_intdigest(state)]


def test_every_version_written_in_format_1_reads_as_written(format1_dir: Path) -> None:
    manifest = _manifest(format1_dir)
    with Store(StoreConfig(data_dir=format1_dir)) as store:
        for sid, versions in manifest.items():
            for version, expected in enumerate(versions, 1):
                assert _digest(store.get(sid, version).state) == expected, (sid, version)
            assert _digest(store.get(sid).state) == versions[-1]


def test_writes_continue_format_1_chains_and_verify_passes(format1_dir: Path) -> None:
    manifest = _manifest(format1_dir)
    patch = b"\x0a\x04more"
    with Store(StoreConfig(data_dir=format1_dir)) as store:
        head = store.get("merge").state
        for n in range(3):
            store.put("merge", patch, mode=WriteMode.MERGE, expected_version=len(manifest["merge"]) + n)
        replaced = store.get("replace").state + b" and more"
        store.put("replace", replaced, expected_version=len(manifest["replace"]))
        assert store.get("merge").state == head + patch * 3
        assert store.get("replace").state == replaced
        for sid, versions in manifest.items():  # the old versions are untouched
            for version, expected in enumerate(versions, 1):
                assert _digest(store.get(sid, version).state) == expected, (sid, version)
    with Store(StoreConfig(data_dir=format1_dir)) as store:  # and read back cold
        assert store.get("merge").state == head + patch * 3
    verify = ckpt("verify", "--data-dir", str(format1_dir))
    assert verify.returncode == 0, verify.stderr.decode() + verify.stdout.decode()


def test_a_sidecar_serves_a_format_1_store_as_it_is(format1_dir: Path) -> None:
    manifest = _manifest(format1_dir)
    sidecar = start_sidecar(format1_dir)
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            for sid, versions in manifest.items():
                got = client.get(sid)
                assert (got.version, _digest(got.state)) == (len(versions), versions[-1]), sid
            put = client.merge("merge", b"\x0a\x02ok", expected_version=len(manifest["merge"]))
            assert put.version == len(manifest["merge"]) + 1
            assert client.get("merge", put.version).state.endswith(b"\x0a\x02ok")
    finally:
        assert sidecar.stop() == 0, sidecar.log()
