"""What a power cut could undo is flushed first: a blob file is removed only once the commit that dropped its
record is on disk, whatever the durability (under Durability.NO_META_SYNC an OS crash may undo the last
commits, and one undone after its blob's file was removed would bring back a record naming no file); and each
directory the store makes is flushed into its parent before anything acknowledged lives in it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ckpt.sidecar.config import StoreConfig
from ckpt.sidecar.config.store import Durability
from ckpt.sidecar.store import Store
from tests.store.support import storage_of


class _RecordingEnv:
    """An LMDB environment that records its forced syncs in ``events`` (and does them)."""

    def __init__(self, env: Any, events: list[str]) -> None:
        self._env, self._events = env, events

    def sync(self, force: bool = False) -> None:
        self._events.append(f"sync force={force}")
        self._env.sync(force)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


@pytest.mark.parametrize("durability", list(Durability), ids=lambda d: d.value)
def test_a_blob_file_goes_only_after_the_commit_dropping_its_record_is_flushed(
    tmp_path: Path, durability: Durability, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store(StoreConfig(data_dir=tmp_path / "data", durability=durability)) as store:
        store.put("s", b"names a blob")
        info = store.put_blob("s", [b"blob bytes" * 1000])
        events: list[str] = []
        storage = storage_of(store)
        storage.env = _RecordingEnv(storage.env, events)
        files = store.blob_files
        remove = files.remove

        def recording_remove(sha256: str) -> bool:
            events.append(f"remove {sha256[:8]}")
            return bool(remove(sha256))

        monkeypatch.setattr(files, "remove", recording_remove)
        assert store.delete_session("s") == 1
        removed = f"remove {info.sha256[:8]}"
        assert removed in events
        before = events[: events.index(removed)]
        if durability is Durability.NO_META_SYNC:
            assert "sync force=True" in before, events
        assert not files.path(info.sha256).exists()


def test_every_directory_the_store_makes_is_flushed_into_its_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flushed: list[Path] = []
    fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        flushed.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    data = tmp_path / "new" / "data"  # two levels made
    with Store(StoreConfig(data_dir=data)) as store:
        store.put("s", b"state")
        store.put_blob("s", [b"blob bytes"])  # makes blobs/, blobs/tmp, blobs/sha256 and its fan-out directory
        made = [p for p in sorted(tmp_path.rglob("*")) if p.is_dir()]
    assert {data / "blobs" / "tmp", data / "blobs" / "sha256", data / "lmdb"} <= set(made)
    missing = [p for p in made if p.parent not in flushed]
    assert missing == [], f"made, their parent never flushed: {missing}"
    assert data / "lmdb" in flushed  # data.mdb's entry, which LMDB made
