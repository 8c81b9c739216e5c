"""`ckpt compact` and `ckpt backup` cut by a power cut at their steps (the writes, flushes and renames they
make under the directory, powercut.c; every one where the copy is flushed and put in place): the store is
whole on each disk the cut may leave, every version it held reading back, and a backup's destination
holds a whole backup or nothing, as docs/operations.md promises; a backup that returned is on the disk."""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from ckpt.sidecar.config import StoreConfig
from ckpt.sidecar.store import Store
from tests.powercut.image import PowerCut, verified
from tests.support import ROOT, ckpt

States = dict[tuple[str, int], bytes]


def _store_with_free_pages(data_dir: Path) -> tuple[States, str]:
    """A store of sessions written interleaved, a third deleted (pages for a compaction to leave out), one
    holding a blob: the versions left and the blob's SHA-256."""
    rng, states = random.Random(3), {}
    with Store(StoreConfig(data_dir=data_dir)) as store:
        for i in range(240):
            sid = f"s{i % 30}"
            state = rng.randbytes(rng.choice((100, 2000, 9000)))
            states[(sid, store.put(sid, state).version)] = state
        blob = store.put_blob("s1", [rng.randbytes(150_000)]).sha256
        for i in range(0, 30, 3):
            store.delete_session(f"s{i}")
    return {key: state for key, state in states.items() if int(key[0][1:]) % 3}, blob


def _holds(data_dir: Path, states: States, blob: str) -> None:
    verified(data_dir)
    with Store(StoreConfig(data_dir=data_dir)) as store:
        for (sid, version), state in states.items():
            assert store.get(sid, version).state == state, (data_dir, sid, version)
        assert store.blob(blob).sha256 == blob


def _cut_at_each_step(
    tmp_path: Path,
    library: Path,
    original: Path,
    args: Callable[[Path], list[str]],
    check: Callable[[Path, bool], None],
) -> int:
    """Runs ``ckpt ARGS`` (``args`` of the watched directory, which holds a copy of ``original`` as ``data``)
    once whole, then cut at its steps in turn (_steps_to_cut); ``check(disk, finished)`` on what the whole
    run flushed, then on a disk each cut may leave: what was flushed alone, or that with a random part of
    the rest. The steps the whole run made."""

    def run(step: int) -> PowerCut:
        cut = PowerCut.make(library, tmp_path / f"cut-{step}" / "dir", tmp_path / f"cut-{step}" / "shadow")
        shutil.copytree(original, cut.watched / "data")
        cut.adopt()
        env = {**cut.env(), "POWERCUT_AT_STEP": str(step)}
        done = subprocess.run(
            [sys.executable, "-m", "ckpt.sidecar.cli", *args(cut.watched)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == (0 if step == 0 else -9), done.stderr
        return cut

    whole = run(0)
    check(whole.rebuild(tmp_path / "cut-0" / "disk"), True)  # what it said it did is on the disk
    for step in _steps_to_cut(whole.steps()):
        cut = run(step)
        # Each disk opened costs a second or two: the flushed one, or one with more, by turns.
        rng = random.Random(step) if step % 2 else None
        check(cut.rebuild(tmp_path / f"cut-{step}" / "disk", rng=rng), False)
        shutil.rmtree(tmp_path / f"cut-{step}")
    return whole.steps()


def _steps_to_cut(steps: int) -> list[int]:
    """Every one of the first 3 steps and the last 16 (where the copy is flushed and put in place), and 8
    of the copy's writes between."""
    assert steps > 0
    between = range(4, max(4, steps - 16))
    picked = {*range(1, min(steps, 3) + 1), *range(max(1, steps - 15), steps + 1)}
    picked |= {between[i * len(between) // 8] for i in range(8) if len(between) > i * len(between) // 8}
    return sorted(picked)


def test_a_compaction_cut_at_any_step_leaves_the_store_whole(tmp_path: Path, powercut_library: Path) -> None:
    original = tmp_path / "original"
    states, blob = _store_with_free_pages(original)
    steps = _cut_at_each_step(
        tmp_path,
        powercut_library,
        original,
        lambda watched: ["compact", "--data-dir", str(watched / "data")],
        lambda disk, _: _holds(disk / "data", states, blob),
    )
    assert steps >= 10  # the copy's writes, its flush, the rename and the directory's flush at least


def test_a_backup_cut_at_any_step_leaves_a_whole_backup_or_none(tmp_path: Path, powercut_library: Path) -> None:
    original = tmp_path / "original"
    states, blob = _store_with_free_pages(original)

    def check(disk: Path, finished: bool) -> None:
        _holds(disk / "data", states, blob)
        if not (disk / "backup").exists():
            assert not finished, "a backup that returned is not on the disk"
            # None made: the next backup to that destination makes it, and removes the copy the cut left.
            done = ckpt("backup", str(disk / "backup"), "--data-dir", str(disk / "data"))
            assert done.returncode == 0, done.stderr.decode()
            assert sorted(p.name for p in disk.iterdir()) == ["backup", "data"]
        _holds(disk / "backup", states, blob)

    steps = _cut_at_each_step(
        tmp_path,
        powercut_library,
        original,
        lambda watched: ["backup", str(watched / "backup"), "--data-dir", str(watched / "data")],
        check,
    )
    assert steps >= 4
