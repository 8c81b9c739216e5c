"""What an operator sees of the background sweeper: before, nothing showed that retention,
request-id expiry or quiet keyframes ran at all (no log line, no metric), so a sweeper that
never ran (say, a sidecar restarted more often than its sweep interval) went unnoticed.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from ckpt.sidecar import Retention, Store, StoreConfig
from ckpt.sidecar.client import CheckpointClient
from tests.store.test_store_full import scrape
from tests.support import free_port, start_sidecar


def test_a_sweep_counts_what_it_did(tmp_path: Path) -> None:
    config = StoreConfig(
        data_dir=tmp_path / "data",
        retention=Retention(keep_last_versions=2),
        request_id_ttl_seconds=1,
        sweep_interval_seconds=3600,
    )
    with Store(config) as store:
        assert (store.counters.sweeps, store.counters.last_sweep_unix_seconds) == (0, None)
        for v in range(6):
            store.put("s", random.Random(v).randbytes(5_000), request_id=f"r{v}")  # incompressible: all FULL
        before = time.time()
        first = store.sweep(now_nanos=time.time_ns() + 2 * 10**9)  # the request ids are past their TTL then
        assert (first.versions_removed, first.request_ids_expired) == (4, 6)
        second = store.sweep()
        assert (second.versions_removed, second.request_ids_expired) == (0, 0)
        assert store.counters.sweeps == 2
        swept = store.counters.swept
        assert (swept.versions_removed, swept.request_ids_expired, swept.sessions_pruned) == (4, 6, 1)
        assert store.counters.last_sweep_unix_seconds is not None and store.counters.last_sweep_unix_seconds >= before


def test_the_sweeper_shows_in_metrics_and_logs_what_it_removed(tmp_path: Path) -> None:
    port = free_port()
    sidecar = start_sidecar(
        tmp_path / "data",
        "--metrics-port",
        str(port),
        "--keep-last-versions",
        "1",
        "--sweep-interval-seconds",
        "0.2",
    )
    sidecar.metrics_port = port  # type: ignore[attr-defined]
    try:
        with CheckpointClient(sidecar.unix_target) as c:
            for v in range(5):
                c.put("s", random.Random(v).randbytes(5_000))  # incompressible: every version a FULL frame
        deadline = time.monotonic() + 20
        while (m := scrape(sidecar))["ckpt_sweep_versions_removed_total"] < 4:
            assert time.monotonic() < deadline, m
            time.sleep(0.1)
        sweeps = m["ckpt_sweeps_total"]
        assert sweeps >= 1
        assert time.time() - 20 < m["ckpt_last_sweep_timestamp_seconds"] <= time.time()
        while scrape(sidecar)["ckpt_sweeps_total"] < sweeps + 2:  # it goes on sweeping, finding nothing
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert scrape(sidecar)["ckpt_sweep_versions_removed_total"] == 4
    finally:
        assert sidecar.stop() == 0, sidecar.log()
    logged = [line for line in sidecar.log().splitlines() if "retention sweep:" in line]
    # Only sweeps that did something are logged: one, however many swept since.
    assert len(logged) == 1, logged
    assert (
        "4 versions removed from 1 sessions, 0 request ids expired, 0 quiet heads folded, 0 quiet keyframes written"
        in logged[0]
    )


def test_a_store_restarted_more_often_than_its_sweep_interval_still_sweeps(tmp_path: Path) -> None:
    """The sweeper counted its interval from each start, so a store reopened more often than that (a
    deploy every 30 minutes, hourly sweeps) never swept. It now goes on from when the last sweep began
    (kept in the store): once that is an interval ago, a reopened store sweeps at once."""
    config = StoreConfig(
        data_dir=tmp_path / "data", retention=Retention(keep_last_versions=1), sweep_interval_seconds=1.5
    )
    with Store(config) as store:
        for v in range(3):
            store.put("s", random.Random(v).randbytes(5_000))  # incompressible: every version a FULL frame
    swept_in: list[int] = []
    for run in range(12):  # each run 0.4 s, well under the interval
        with Store(config) as store:
            deadline = time.monotonic() + 0.4
            while not store.counters.sweeps and time.monotonic() < deadline:
                time.sleep(0.02)
            if store.counters.sweeps:
                swept_in.append(run)
                assert store.list_versions("s")[0][0].version == 3
                assert store.session("s").version_count == 1  # retention applied
    assert swept_in, "no run swept"
    # The first sweep came once an interval had passed since the store was first opened, not at every start.
    assert swept_in[0] >= 2, swept_in
