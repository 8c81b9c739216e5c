"""The scale benchmark's mechanics at a small size (the 1,000,000-session run is opt-in)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import store_bench
from sidecar import PutRequest, PutResult, Store, StoreError


def test_scale_reads_every_pass_back_exactly_and_checks_the_like_for_like_passes(tmp_path: Path) -> None:
    r = store_bench.scale(
        tmp_path, 300, probe_at=100, reads=200, cold_reads=20, interleaved_sessions=120, interleaved_active=40
    )

    assert [p["sessions"] for p in r["probes"]] == [100, 300]
    for probe in r["probes"]:
        assert list(probe["passes"]) == ["as filled", "from disk", "file pre-read", "each read from disk"]
        assert probe["mismatches"] == 0
        assert probe["cold_reads_each"] == 20
    # The store was closed and reopened for the "from disk" pass and before each
    # read of the "each read from disk" pass; its counters still cover every write.
    assert r["store_stats"]["versions"] == 300 * store_bench.VERSIONS_PER_SESSION
    assert r["store_stats"]["commits"] >= 2
    by_pass = {
        name: r["probes"][-1]["passes"][name]["latest_us"]["p99"] / r["probes"][0]["passes"][name]["latest_us"]["p99"]
        for name in ("as filled", "from disk", "file pre-read", "each read from disk")
    }
    assert r["p99_growth_latest"] == max(by_pass["each read from disk"], by_pass["file pre-read"])
    assert r["p99_growth_latest_from_disk"] == by_pass["from disk"]
    assert r["p99_growth_latest_as_filled"] == by_pass["as filled"]
    assert not (tmp_path / "scale").exists()  # the benchmark removes its store
    assert not (tmp_path / "scale-interleaved").exists()

    # The interleaved fill wrote every version of its 120 sessions and left the right heads.
    il = r["interleaved"]
    assert (il["sessions"], il["active"]) == (120, 40)
    assert il["versions"] == 120 * store_bench.VERSIONS_PER_SESSION
    assert (il["heads_checked"], il["mismatches"]) == (120, 0)
    assert il["disk"]["file_vs_frames"] == il["disk"]["file_bytes"] / il["disk"]["frames_bytes"]
    assert "interleaved" in store_bench.render_scale(r)


def test_interleaved_fill_draws_sessions_out_of_key_order_and_keeps_each_sessions_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, int]] = []
    real_put_many = Store.put_many

    def recording_put_many(self: Store, requests: list[PutRequest]) -> list[PutResult | StoreError]:
        results = real_put_many(self, requests)
        for req, res in zip(requests, results, strict=True):
            assert isinstance(res, PutResult), res
            seen.append((req.session_id, res.version))
        return results

    monkeypatch.setattr(Store, "put_many", recording_put_many)
    r = store_bench.interleaved_fill(tmp_path, store_bench.ScaleData(width=8), 50, active=10, batch_writes=16)

    assert r["mismatches"] == 0
    versions_by_session: dict[str, list[int]] = {}
    for sid, version in seen:
        versions_by_session.setdefault(sid, []).append(version)
    assert len(versions_by_session) == 50
    assert all(v == [1, 2, 3] for v in versions_by_session.values())
    # Not session after session: some session's versions are split by another session's writes.
    assert seen != sorted(seen)
