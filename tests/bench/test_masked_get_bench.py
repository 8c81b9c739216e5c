"""The masked-Get benchmark, run tiny: a real sidecar, the corpus's largest trajectory written typed,
cold and hot masked and whole Gets measured, every figure reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpt.bench import masked_get


def test_the_masked_get_benchmark_measures_cold_and_hot_reads_of_the_largest_state(
    tmp_path: Path, trajectory_corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CKPT_BENCH_DIR", str(tmp_path / "scratch"))
    out = tmp_path / "masked.json"
    code = masked_get.main(
        [
            "--sessions",
            "2",
            "--rounds",
            "1",
            "--hot-reads",
            "3",
            "--trajectories",
            str(trajectory_corpus),
            "--json",
            str(out),
        ]
    )
    report = json.loads(out.read_text())
    assert code == (0 if all(c["ok"] for c in report["checks"].values()) else 1)
    assert report["mask"] == ["handoff", "plan"] and report["rounds"] == 1
    sizes = [s["state_bytes"] for s in report["sessions"]]
    assert len(sizes) == 2 and sizes == sorted(sizes, reverse=True)  # the largest first
    for s in report["sessions"]:
        assert 0 < s["masked_state_bytes"] < s["state_bytes"]
        for name in ("cold_masked_us", "cold_full_us", "hot_masked_us", "hot_full_us"):
            assert len(s[name]) == 1 and s[name][0] > 0, name
    assert set(report["checks"]) == {"cold_masked_vs_full_largest", "hot_masked_vs_full_largest"}
    assert report["floor_us"] > 0 and report["floor_vs_full_largest"] > 0
    # The sidecar ran under $CKPT_BENCH_DIR, its data directory removed after a clean run.
    assert (tmp_path / "scratch").is_dir() and not [p for p in (tmp_path / "scratch").iterdir() if p.is_dir()]
