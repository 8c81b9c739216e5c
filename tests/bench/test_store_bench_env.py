"""The store benchmark names what bounds its figures: the idle-memory pageout policy, the group-commit ceiling."""

from __future__ import annotations

from pathlib import Path

from ckpt.bench.store_bench.commits import group_commit, render_group_commit, tmpfs_root
from ckpt.bench.store_bench.common import damon_pageout


def _scheme(root: Path, *, state: str, action: str, aggr_us: int, min_age: int, max_accesses: int) -> None:
    kdamond = root / "0"
    context = kdamond / "contexts" / "0"
    scheme = context / "schemes" / "0"
    (scheme / "access_pattern" / "age").mkdir(parents=True)
    (scheme / "access_pattern" / "nr_accesses").mkdir(parents=True)
    (context / "monitoring_attrs" / "intervals").mkdir(parents=True)
    (kdamond / "state").write_text(state + "\n")
    (scheme / "action").write_text(action + "\n")
    (context / "monitoring_attrs" / "intervals" / "aggr_us").write_text(f"{aggr_us}\n")
    (scheme / "access_pattern" / "age" / "min").write_text(f"{min_age}\n")
    (scheme / "access_pattern" / "nr_accesses" / "max").write_text(f"{max_accesses}\n")


def test_a_running_pageout_scheme_is_described_in_seconds(tmp_path: Path) -> None:
    _scheme(tmp_path, state="on", action="pageout", aggr_us=5_000_000, min_age=12, max_accesses=1)
    assert damon_pageout(tmp_path) == "DAMON pageout of memory idle >= 60 s (nr_accesses <= 1)"


def test_stopped_or_other_schemes_and_no_damon_say_none(tmp_path: Path) -> None:
    assert damon_pageout(tmp_path / "missing") == "none found"
    _scheme(tmp_path / "off", state="off", action="pageout", aggr_us=100_000, min_age=10, max_accesses=0)
    _scheme(tmp_path / "stat", state="on", action="stat", aggr_us=100_000, min_age=10, max_accesses=0)
    assert damon_pageout(tmp_path / "off") == "none found"
    assert damon_pageout(tmp_path / "stat") == "none found"


def test_the_group_commit_report_gives_the_ceiling_tmpfs_allows(tmp_path: Path) -> None:
    # Tiny run: every configuration writes, the tmpfs one leaves nothing behind,
    # and the report states the ceiling beside the checked ratio.
    r = group_commit(tmp_path, threads=3, versions=2, rounds=1)
    assert set(r["writes_per_s"]) >= {"group", "per_put", "group_asyncio", "per_put_asyncio"}
    memory_root = tmpfs_root()
    if memory_root is None:  # no writable /dev/shm: reported as absent, not guessed
        assert r["speedup_ceiling"] is None
        assert "ceiling" not in render_group_commit(r)
        return
    assert r["speedup_ceiling"] == r["writes_per_s"]["group_memory"] / r["writes_per_s"]["per_put"]
    assert r["batches"]["group_memory"]["writes"] == 6
    assert not memory_root.exists()
    text = render_group_commit(r)
    assert "data on tmpfs (flushes free: the CPU ceiling)" in text
    assert f"ceiling, 3 threads (reported): {r['speedup_ceiling']:.2f}x" in text
