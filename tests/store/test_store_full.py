"""What an operator sees of a store filling up: gauges to alert on before it is full,
a count of the writes refused once it is, and a log line saying so.

Before, /metrics had nothing on the store's size (only `ckpt stats`, run by hand,
said how much of the map was in use), a full store showed only as
RESOURCE_EXHAUSTED among the Put errors, the same as a client's too-large state,
and the sidecar logged nothing while refusing every write.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ckpt.sidecar import PutRequest, Store, StoreConfig, StoreFull
from ckpt.sidecar.client import CheckpointClient, ResourceExhaustedError
from ckpt.sidecar.client.arguments import new_request_id
from ckpt.sidecar.limits import map_reserve_bytes
from ckpt.sidecar.tools.backup import backup
from tests.support import Sidecar, free_port, metrics_text, start_sidecar

MAP_CAP = 4 << 20


def scrape(sidecar: Sidecar) -> dict[str, float]:
    """Every unlabelled ckpt sample of one scrape."""
    return {name: float(value) for name, value in re.findall(r"^(ckpt_\S+) (\S+)$", metrics_text(sidecar), re.M)}


def test_a_filling_store_shows_in_metrics_and_a_full_one_in_the_log(tmp_path: Path) -> None:
    port = free_port()
    sidecar = start_sidecar(tmp_path / "data", "--metrics-port", str(port), "--max-map-size-bytes", str(MAP_CAP))
    sidecar.metrics_port = port  # type: ignore[attr-defined]
    try:
        empty = scrape(sidecar)
        assert empty["ckpt_sessions"] == 0 and empty["ckpt_versions"] == 0
        assert empty["ckpt_store_max_map_size_bytes"] == MAP_CAP
        assert 0 < empty["ckpt_store_used_bytes"] <= empty["ckpt_store_map_size_bytes"] <= MAP_CAP
        assert empty["ckpt_store_full_writes_total"] == 0
        written, refused = 0, 0
        with CheckpointClient(sidecar.unix_target) as c:
            while refused < 3:
                assert written < 1000, "the store never filled"
                try:
                    c.put(f"fill-{written}", os.urandom(20_000))  # incompressible: ~20 KB a frame
                    written += 1
                except ResourceExhaustedError as exc:
                    assert "the store is full" in str(exc)
                    refused += 1
        full = scrape(sidecar)
    finally:
        assert sidecar.stop() == 0, sidecar.log()
    assert full["ckpt_sessions"] == written and full["ckpt_versions"] == written
    assert full["ckpt_store_full_writes_total"] == refused
    assert "ckpt_map_resizes_total" in full
    assert full["ckpt_store_map_size_bytes"] == MAP_CAP - map_reserve_bytes(MAP_CAP)  # the rest: deletes'
    # What an alert on used / max would have seen coming.
    assert 0.8 * MAP_CAP < full["ckpt_store_used_bytes"] <= MAP_CAP
    # Logged once, not once per refused write (then at most once a minute, with the count).
    warnings = [line for line in sidecar.log().splitlines() if "the store is full" in line]
    assert len(warnings) == 1, sidecar.log()
    assert "WARNING" in warnings[0] and "refused 1 write: the store is full" in warnings[0]
    assert "--max-map-size-bytes" in warnings[0]


def test_a_data_file_over_a_lowered_map_cap_is_named_as_such(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A store grown under a larger --max-map-size-bytes, reopened under a smaller one, maps its file's
    size and cannot grow: the open warns, and a refusal names the file's size, not a map that 'reached
    max_map_size_bytes (1048576)' beside a 3 MB data.mdb (as when a 13 MB backup is served under a 4 MiB cap)."""
    with Store(StoreConfig(data_dir=tmp_path / "data", map_size_bytes=1 << 20)) as store:
        store.put_many([PutRequest(f"s{n}", os.urandom(100_000)) for n in range(30)])
        backup(store, tmp_path / "copy")  # compacted: no free pages, so the next write needs the map to grow
    size = (tmp_path / "copy" / "lmdb" / "data.mdb").stat().st_size
    assert size > 2 << 20
    lowered = StoreConfig(data_dir=tmp_path / "copy", map_size_bytes=1 << 20, max_map_size_bytes=1 << 20)
    with caplog.at_level(logging.WARNING, logger="ckpt.store"), Store(lowered) as store:
        assert len(store.get("s7").state) == 100_000
        with pytest.raises(StoreFull) as refused:
            store.put("s7", os.urandom(100_000))
    over = f"the LMDB map is {size} bytes, the size of {tmp_path / 'copy' / 'lmdb' / 'data.mdb'}, already over"
    cap = "max_map_size_bytes (1048576, less 65536 kept for deletes;"
    assert str(refused.value).startswith(f"the store is full: {over} {cap}")
    assert any(over in record.getMessage() and "cannot grow" in record.getMessage() for record in caplog.records)


def fill(put: Callable[[str, bytes], object], state_bytes: int) -> int:
    """Put incompressible states of ``state_bytes`` until the store refuses one: how many it took."""
    for written in range(1000):
        try:
            put(f"fill-{written}", os.urandom(state_bytes))
        except (StoreFull, ResourceExhaustedError) as exc:
            assert "the store is full" in str(exc)
            return written
    raise AssertionError("the store never filled")


def test_a_write_refused_at_the_cap_succeeds_on_its_first_retry_after_a_delete(tmp_path: Path) -> None:
    """LMDB reuses pages a commit freed only after one more commit: the delete's room was found only
    once some unrelated write committed, and retries of the refused write kept failing until then."""
    sidecar = start_sidecar(tmp_path / "data", "--max-map-size-bytes", str(MAP_CAP))
    try:
        with CheckpointClient(sidecar.unix_target) as c:
            written = fill(c.put, 256 << 10)
            state = os.urandom(256 << 10)
            with pytest.raises(ResourceExhaustedError, match="the store is full"):
                c.put("refused", state, request_id="refused-1")
            c.delete("fill-0")
            assert c.put("refused", state, request_id="refused-1").version == 1
            assert c.get("refused").state == state
            assert [s.session_id for s in c.sessions()].count("refused") == 1
            assert len(list(c.sessions())) == written  # one deleted, one added
        assert sidecar.stop() == 0, sidecar.log()
    finally:
        sidecar.stop()


def test_an_embedded_store_finds_a_deleted_sessions_room_unless_a_reader_holds_it(tmp_path: Path) -> None:
    config = StoreConfig(data_dir=tmp_path / "data", map_size_bytes=MAP_CAP, max_map_size_bytes=MAP_CAP)
    with Store(config) as store:
        fill(store.put, 256 << 10)
        state = os.urandom(256 << 10)
        with store.read():  # a snapshot from before the delete: the deleted session's pages are still its own
            store.delete_session("fill-0")
            with pytest.raises(StoreFull, match="the store is full"):
                store.put("refused", state, request_id="refused-1")
        assert store.put("refused", state, request_id="refused-1").version == 1
        assert store.get("refused").state == state
        # Once more, with no reader: the retry right after the delete finds its room.
        with pytest.raises(StoreFull):
            store.put("refused-too", state, request_id="refused-2")
        store.delete_session("fill-1")
        assert store.put("refused-too", state, request_id="refused-2").version == 1


def test_a_store_full_of_writes_still_deletes_its_way_out(tmp_path: Path) -> None:
    """Every delete copies the pages it changes: once writes of ever smaller states had taken the map's last
    pages, and a reader's snapshot held the free ones, deleting a session failed as full too, and a full
    store could then only be raised, never emptied. Other writes now stop short of a reserve that deletes
    may use."""
    config = StoreConfig(data_dir=tmp_path / "data", map_size_bytes=1 << 20, max_map_size_bytes=1 << 20)
    with Store(config) as store:
        sessions: list[str] = []

        def put(session_id: str, state: bytes) -> object:
            made = store.put(f"{session_id}-{len(state)}", state, request_id=new_request_id())
            sessions.append(f"{session_id}-{len(state)}")
            return made

        for state_bytes in (64 << 10, 4096, 256):  # until not even a small write fits
            fill(put, state_bytes)
        assert sessions
        data_file = tmp_path / "data" / "lmdb" / "data.mdb"
        assert data_file.stat().st_size <= (1 << 20) - map_reserve_bytes(1 << 20)  # the reserve left alone
        with store.read():  # a snapshot of the full store: no page freed since may be reused while it stands
            assert store.delete_session(sessions.pop()) == 1
        for session_id in sessions:
            assert store.delete_session(session_id) == 1
        # Room for other writes again (less what the request records of the deleted sessions' puts keep until
        # they expire: they outlive their session, so a retry of its put is still answered).
        assert fill(lambda session_id, state: store.put(session_id, state), 4096) > 0
    assert data_file.stat().st_size <= 1 << 20


def test_a_sweep_that_finds_no_room_is_not_counted_as_a_refused_write(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A sweep's own writes (here a quiet head's keyframe) refused for want of room counted in
    ckpt_store_full_writes_total and were logged as a refused write to "retry with the same request_id":
    an alert on that metric fired while no client write had failed."""
    config = StoreConfig(
        data_dir=tmp_path / "data",
        map_size_bytes=MAP_CAP,
        max_map_size_bytes=MAP_CAP,
        keyframe_after_quiet_seconds=1,
    )
    with Store(config) as store:
        base = os.urandom(200_000)
        for n in range(8):  # a chain of deltas, whose keyframe is a whole state
            store.put("quiet", base[n:] + base[:n])
        fill(store.put, 256 << 10)
        before = store.counters.store_full_refusals
        caplog.clear()  # the fill's own refusal was logged
        with caplog.at_level(logging.WARNING, logger="ckpt.store"), pytest.raises(StoreFull) as refused:
            store.sweep(now_nanos=time.time_ns() + 3_600 * 10**9)
        assert "request_id" not in str(refused.value)
        assert store.counters.store_full_refusals == before
        assert not [r for r in caplog.records if "refused" in r.getMessage()]
