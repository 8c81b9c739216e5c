"""The quiet-keyframes benchmark checks every resume read, MERGE sessions' as REPLACE sessions'."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ckpt.bench.store_bench import keyframes
from ckpt.sidecar import GetResult, Store


def _corpus(path: Path) -> str:
    path.mkdir()
    with (path / "tiny.jsonl").open("w") as fh:
        for t in range(3):
            messages = [{"role": "user" if i % 2 else "assistant", "content": f"t{t} m{i} " * 20} for i in range(14)]
            fh.write(json.dumps({"id": f"t{t}", "source": "test", "messages": messages}) + "\n")
    return str(path)


def test_quiet_keyframes_reads_back_every_mode_exactly(tmp_path: Path) -> None:
    r = keyframes.quiet_keyframes(tmp_path / "data", _corpus(tmp_path / "corpus"))
    assert set(r["modes"]) == {"REPLACE", "MERGE"}
    for mode, m in r["modes"].items():
        assert m["resume_reads"] > 0, mode
        assert m["mismatches"] == 0, mode


def test_quiet_keyframes_counts_wrong_merge_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_get = Store.get

    def wrong_get(self: Store, *args: Any, **kwargs: Any) -> Any:
        got = real_get(self, *args, **kwargs)
        return GetResult(got.version, b"\x08\x07", got.info)  # a Checkpoint, not the one written

    monkeypatch.setattr(Store, "get", wrong_get)
    r = keyframes.quiet_keyframes(tmp_path / "data", _corpus(tmp_path / "corpus"))
    for mode, m in r["modes"].items():
        # Three stores side by side: every resume read of each is counted.
        assert m["mismatches"] == 3 * m["resume_reads"] > 0, mode
    assert "MERGE: " in keyframes.render_quiet_keyframes(r)
