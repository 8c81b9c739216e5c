"""The scale benchmark's mechanics at a small size (the 1,000,000-session run is opt-in)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import pytest

from ckpt.bench import store_bench
from ckpt.bench.store_bench import scale_reads
from ckpt.sidecar import PutRequest, PutResult, Store, StoreConfig, StoreError


def test_scale_reads_every_pass_back_exactly_and_checks_the_like_for_like_passes(tmp_path: Path) -> None:
    r = store_bench.scale(
        tmp_path, 300, probe_at=100, reads=200, cold_reads=20, interleaved_sessions=120, interleaved_active=40
    )

    assert [p["sessions"] for p in r["probes"]] == [100, 300]
    for probe in r["probes"]:
        assert list(probe["passes"]) == ["as filled", "from disk", "file pre-read", "each read from disk"]
        assert probe["mismatches"] == 0
        assert probe["cold_reads_each"] == 20
    # The stores were closed and reopened for the "from disk" pass and before each
    # read of the "each read from disk" pass; the larger one's counters still cover its every write.
    assert r["store_stats"]["versions"] == 300 * store_bench.VERSIONS_PER_SESSION
    assert r["store_stats"]["commits"] >= 2
    by_pass = {
        name: r["probes"][-1]["passes"][name]["latest_us"]["p99"] / r["probes"][0]["passes"][name]["latest_us"]["p99"]
        for name in ("as filled", "from disk", "file pre-read", "each read from disk")
    }
    assert r["p99_growth_latest"] == max(by_pass["each read from disk"], by_pass["file pre-read"])
    assert r["p99_growth_latest_from_disk"] == by_pass["from disk"]
    assert r["p99_growth_latest_as_filled"] == by_pass["as filled"]
    assert not (tmp_path / "scale-100").exists()  # the benchmark removes its stores
    assert not (tmp_path / "scale-300").exists()
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


def test_reads_from_disk_take_turns_between_the_sizes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checked pass compares sizes side by side: each pick of one store is followed by one of the
    other (which goes first alternating), each get on a store reopened with its file evicted."""
    data = store_bench.ScaleData(width=8)
    stores: list[tuple[Callable[[], Store], Store, int]] = []
    for n in (5, 12):
        config = StoreConfig(data_dir=tmp_path / f"s{n}", cache_size_bytes=0)
        with Store(config) as store:
            store.put_many(data.requests(0, n))
        stores.append((functools.partial(Store, config), Store(config), n))
    gets: list[tuple[int, str, int]] = []
    real_get = Store.get

    def recording_get(self: Store, session_id: str, version: int = 0, **kw: bool) -> object:
        gets.append((int(self.config.data_dir.name[1:]), session_id, version))
        return real_get(self, session_id, version, **kw)

    evicted: list[Path] = []
    real_evict = scale_reads.evict_from_page_cache
    monkeypatch.setattr(Store, "get", recording_get)

    def recording_evict(path: Path) -> None:
        evicted.append(path)
        real_evict(path)

    # Recorded, not replaced: which file each get found evicted is not visible from outside.
    monkeypatch.setattr(scale_reads, "evict_from_page_cache", recording_evict)
    opened, results = scale_reads.each_read_from_disk(stores, data, 4, seed=9)
    try:
        assert [g[0] for g in gets] == [5, 5, 12, 12, 12, 12, 5, 5] * 2  # latest, then an older version
        assert all(int(sid[1:]) < n for n, sid, _ in gets)  # each store's picks among its own sessions
        assert [v == 0 for _, _, v in gets] == [True, False] * 8
        assert len(evicted) == len(gets) and all(e.name == "data.mdb" for e in evicted)
        assert [r["mismatches"] for r in results] == [0, 0]
        assert all(len(r["latest_us"]) == 3 for r in results)  # p50, p99, p999 of 4 reads each
    finally:
        for store in opened:
            store.close()


def test_the_pre_read_pass_leaves_reads_that_waited_on_the_disk_out_of_its_percentiles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass meant to find every page cached counts a read that faulted (a page the kernel evicted since
    the pre-read) but leaves it out of the timings; the other passes time every read."""
    data = store_bench.ScaleData(width=8)
    calls = 0

    def majflt() -> int:  # read before and after each get, 3 calls a pick: every even pick's latest read faults
        nonlocal calls
        pick, at = divmod(calls, 3)
        calls += 1
        return 2 * pick + (1 if at and pick % 2 == 0 else 0)

    with Store(StoreConfig(data_dir=tmp_path / "s", cache_size_bytes=0)) as store:
        store.put_many(data.requests(0, 10))
        # The kernel decides which reads fault; the count is replaced to make some do.
        monkeypatch.setattr(scale_reads, "major_faults", majflt)
        every = scale_reads.read_pass(store, data, 10, 40, seed=3)
        calls = 0
        cached = scale_reads.read_pass(store, data, 10, 40, seed=3, cached_only=True)
    for result in (every, cached):
        assert (result["latest_reads_with_major_fault"], result["old_reads_with_major_fault"]) == (20, 0)
        assert result["mismatches"] == 0
    assert (every["latest_reads_timed"], every["old_reads_timed"]) == (40, 40)
    assert (cached["latest_reads_timed"], cached["old_reads_timed"]) == (20, 40)
