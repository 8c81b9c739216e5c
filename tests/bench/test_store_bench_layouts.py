"""The layout replay at a small size: the store's interleaved fill, replayed keyed and in append order."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ckpt.bench.store_bench.layouts import LAYOUTS, render, replay_layouts
from tests.support import ROOT


def test_the_same_frames_in_commit_order_fill_fewer_pages_and_nothing_is_left_behind(tmp_path: Path) -> None:
    r = replay_layouts(tmp_path, 1500, batch_writes=300)
    keyed, appended = (r[layout] for layout in LAYOUTS)
    # Appended keys fill each page; keys landing mid-page split them in half.
    assert appended["tables_vs_frames"]["frames"] < 0.85 * keyed["tables_vs_frames"]["frames"]
    assert keyed["tables_vs_frames"]["index"] == 0 < appended["tables_vs_frames"]["index"]
    # A value holds its version record and LMDB a node header beside each frame: no table is smaller.
    assert all(r[layout]["tables_vs_frames"]["frames"] > 1.0 for layout in LAYOUTS)
    # The store holds more than its frames and session records: its own file is the larger.
    assert r["store_file_vs_frames"] > keyed["file_vs_frames"]
    assert "| append-ordered |" in render(r)
    assert list(tmp_path.iterdir()) == []


def test_the_replay_runs_as_a_command(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ckpt.bench.store_bench.layouts", "--sessions", "300", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "interleaved fill of 300 sessions" in done.stdout
