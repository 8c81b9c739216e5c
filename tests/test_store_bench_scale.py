"""The scale benchmark's mechanics at a small size (the 1,000,000-session run is opt-in)."""

from __future__ import annotations

from pathlib import Path

from bench import store_bench


def test_scale_reads_every_pass_back_exactly_and_checks_the_like_for_like_passes(tmp_path: Path) -> None:
    r = store_bench.scale(tmp_path, 300, probe_at=100, reads=200)

    assert [p["sessions"] for p in r["probes"]] == [100, 300]
    for probe in r["probes"]:
        assert list(probe["passes"]) == ["as filled", "from disk", "file pre-read"]
        assert probe["mismatches"] == 0
    # The store was closed and reopened for the "from disk" pass at each size;
    # its counters still cover every write.
    assert r["store_stats"]["versions"] == 300 * store_bench.VERSIONS_PER_SESSION
    assert r["store_stats"]["commits"] >= 2
    by_pass = {
        name: r["probes"][-1]["passes"][name]["latest_us"]["p99"] / r["probes"][0]["passes"][name]["latest_us"]["p99"]
        for name in ("as filled", "from disk", "file pre-read")
    }
    assert r["p99_growth_latest"] == max(by_pass["from disk"], by_pass["file pre-read"])
    assert r["p99_growth_latest_as_filled"] == by_pass["as filled"]
    assert not (tmp_path / "scale").exists()  # the benchmark removes its store
