"""`ckpt verify` and `ckpt inspect` read a session a chain at a time: what they hold is bounded by its
largest chain (a FULL frame and the frames after it), not by the session."""

from __future__ import annotations

import random
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt.codec import ChainPolicy, FrameKind, iter_versions
from ckpt.sidecar import Store, StoreConfig
from ckpt.sidecar.cli import offline_commands, verify_command
from ckpt.sidecar.cli.offline_commands import open_readonly
from ckpt.sidecar.cli.verify_command import verify_session
from ckpt.sidecar.store import reads
from ckpt.sidecar.store.records import frame_of

CHAINS = 40
DEPTH = 3  # each chain: a FULL frame of 64 KiB, then DEPTH small DELTA frames
STATE = 64 << 10


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One session of CHAINS chains (each state a chain's own random base and a small random tail)."""
    data = tmp_path_factory.mktemp("chains") / "data"
    rnd = random.Random(7)
    with Store(StoreConfig(data_dir=data, chain_policy=ChainPolicy(max_depth=DEPTH))) as store:
        for _ in range(CHAINS):
            base = rnd.randbytes(STATE)
            for _ in range(DEPTH + 1):
                store.put("s", base[:-512] + rnd.randbytes(512))
    return data


@pytest.fixture
def store(data_dir: Path) -> Iterator[Store]:
    with open_readonly(data_dir) as s:
        yield s


def _inspect(store: Store) -> Any:
    return offline_commands._frame_list(store, "s")


def test_the_session_is_many_chains_and_verify_and_inspect_read_it_whole(store: Store) -> None:
    assert verify_session(store, "s") == []
    info, rows = _inspect(store)
    assert info.head_version == CHAINS * (DEPTH + 1) == len(rows)
    fulls = [version for version, vinfo, _, base in rows if not base and vinfo.frame_kind is FrameKind.FULL]
    assert fulls == list(range(1, CHAINS * (DEPTH + 1), DEPTH + 1))


@pytest.mark.parametrize("command", [lambda s: verify_session(s, "s"), _inspect], ids=["verify", "inspect"])
def test_verify_and_inspect_hold_a_fraction_of_a_session_of_many_chains(
    store: Store, command: Callable[[Store], object]
) -> None:
    stored = store.session("s").stored_bytes
    assert stored > CHAINS * STATE
    tracemalloc.start()
    try:
        command(store)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # One chain is under 1/CHAINS of the session, and decoding it holds a few of its states besides.
    assert peak < stored / 4, (peak, stored)


def test_verify_decodes_each_chain_having_read_no_frame_past_the_one_after_it(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    frames_read = 0
    read_at_decode: list[tuple[int, int]] = []  # (frames read, frames of the chains decoded so far)
    decoded = 0

    def counted_frame_of(value: Any) -> memoryview:
        nonlocal frames_read
        frames_read += 1
        return frame_of(value)

    def noted_iter_versions(chain: list[bytes]) -> Iterator[Any]:
        nonlocal decoded
        decoded += len(chain)
        read_at_decode.append((frames_read, decoded))
        return iter_versions(chain)

    monkeypatch.setattr(reads, "frame_of", counted_frame_of)
    monkeypatch.setattr(verify_command, "iter_versions", noted_iter_versions)
    assert verify_session(store, "s") == []
    assert len(read_at_decode) == CHAINS
    # A chain ends where the next one's FULL frame starts: that frame is the only one read past it.
    assert [read - done for read, done in read_at_decode] == [1] * (CHAINS - 1) + [0]
