"""``Store.cached_info``: the head's VersionInfo when the state cache holds the head (what ``get_cached``
answers, without the state), and ``VersionInfo.has_state``, which tells a caller holding a state whether it
is that version's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ckpt.sidecar.config import StoreConfig
from ckpt.sidecar.errors import Unavailable
from ckpt.sidecar.store import Store


def test_the_cached_heads_info_is_the_one_a_get_answers(tmp_path: Path) -> None:
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        assert store.cached_info("s") is None  # no such session
        first = store.put("s", b"\x08\x01")
        second = store.put("s", b"\x08\x02")
        info = store.cached_info("s")
        assert info is not None
        assert info == store.get("s").info
        assert info.version == second.version
        assert info.has_state(second.state_xxh3)
        assert not info.has_state(first.state_xxh3)
        # Only the head is cached: another version is not answered here.
        assert store.get("s", first.version).info.has_state(first.state_xxh3)
    with pytest.raises(Unavailable, match="the store is closed"):
        store.cached_info("s")


def test_a_state_as_written_before_a_fold_is_the_versions_state(tmp_path: Path) -> None:
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        put = store.put("s", b"\x08\x01")
        info = store.get("s").info
    folded = dataclasses.replace(info, state_xxh3=7, written_state_xxh3=put.state_xxh3)
    assert folded.has_state(7) and folded.has_state(put.state_xxh3) and not folded.has_state(0)
    assert not info.has_state(0)  # no fold: 0 names no state as written
