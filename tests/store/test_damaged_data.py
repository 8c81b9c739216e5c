"""Damaged data, driven as users meet it: a copy of a real sidecar's data directory damaged on purpose
(frames, records, B-tree pages, a truncated file), served by a real `ckpt serve` and checked by the real
`ckpt` CLI. Damage is DATA_LOSS naming what it affects; the undamaged sessions keep serving."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
from pathlib import Path

import lmdb
import pytest

from ckpt.sidecar import Retention, Store, StoreConfig
from ckpt.sidecar.client import (
    CheckpointClient,
    CheckpointError,
    DataLossError,
    NotFoundError,
)
from ckpt.sidecar.store import keys
from tests.store.support import merge_patch, replace_state
from tests.support import ROOT, Sidecar, ckpt, start_sidecar, start_sidecar_sweeping

SESSIONS = ("a", "b", "c", "d")  # a, c: REPLACE (DELTA chains); b, d: MERGE (PATCH chains)
VERSIONS = 140  # several chains each under the default policy: a MERGE chain of these states runs ~60 frames


def expected_state(session: str, version: int) -> bytes:
    if session in "ac":
        return replace_state(session, version)
    return replace_state(session, 1) + b"".join(merge_patch(session, v) for v in range(2, version + 1))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory written by a real sidecar (stopped cleanly): 4 sessions of 20 versions, several chains each."""
    data = tmp_path_factory.mktemp("pristine") / "data"
    sidecar = start_sidecar(data)
    try:
        with CheckpointClient(sidecar.unix_target) as c:
            for session in SESSIONS:
                for v in range(1, VERSIONS + 1):
                    if session in "ac" or v == 1:
                        c.put(session, replace_state(session, v), request_id=f"{session}:{v}")
                    else:
                        c.merge(session, merge_patch(session, v), request_id=f"{session}:{v}")
    finally:
        assert sidecar.stop() == 0
    return data


@pytest.fixture
def damaged(pristine: Path, tmp_path: Path) -> Path:
    """A private copy of the pristine directory, to damage."""
    data = tmp_path / "data"
    shutil.copytree(pristine, data)
    return data


def chain_starts(data: Path, session: str) -> list[int]:
    with Store(StoreConfig(data_dir=data), readonly=True) as store:
        _, frames = store.frames_of(session)
    return [v for v, info, _ in frames if not isinstance(info, Exception) and info.frame_kind.name == "FULL"]


def frame_key(session: str, version: int) -> bytes:
    return session.encode() + b"\x00" + version.to_bytes(8, "big")


class Lmdb:
    """The data directory's LMDB, opened for writing damage into it."""

    def __init__(self, data: Path) -> None:
        self.env = lmdb.open(str(data / "lmdb"), max_dbs=8)
        self.db = {name: self.env.open_db(name.encode()) for name in ("frames", "sessions", "requests")}

    def __enter__(self) -> lmdb.Transaction:
        self.txn = self.env.begin(write=True)
        return self.txn

    def __exit__(self, *exc: object) -> None:
        self.txn.commit()
        self.env.close()


def flip_frame_byte(data: Path, session: str, version: int) -> None:
    db = Lmdb(data)
    with db as txn:
        value = bytearray(txn.get(frame_key(session, version), db=db.db["frames"]) or b"")
        value[-3] ^= 0xFF  # inside the zstd payload
        txn.put(frame_key(session, version), bytes(value), db=db.db["frames"])


def delete_frame(data: Path, session: str, version: int) -> None:
    db = Lmdb(data)
    with db as txn:
        assert txn.delete(frame_key(session, version), db=db.db["frames"])


def cut_frame_bytes(data: Path, session: str, version: int) -> None:
    """The version's metadata length prefix overruns the value: its frame has no bytes left."""
    db = Lmdb(data)
    with db as txn:
        value = bytearray(txn.get(frame_key(session, version), db=db.db["frames"]) or b"")
        value[0:2] = struct.pack("<H", 0xFFFF)
        txn.put(frame_key(session, version), bytes(value), db=db.db["frames"])


def corrupt_session_record(data: Path, session: str) -> None:
    db = Lmdb(data)
    with db as txn:
        txn.put(session.encode(), b"\xff\xff\xff", db=db.db["sessions"])


def corrupt_request_record(data: Path, session: str, request_id: str) -> None:
    db = Lmdb(data)
    with db as txn:
        key = keys.request_key(session.encode(), request_id)
        assert txn.get(key, db=db.db["requests"]) is not None
        txn.put(key, b"\xff\xff\xff", db=db.db["requests"])


def corrupt_root_page(data: Path, table: str) -> None:
    """Clear the page flags of a table's B-tree root: LMDB then reports MDB_CORRUPTED reading that table."""
    env = lmdb.open(str(data / "lmdb"), max_dbs=8, readonly=True)
    with env.begin() as txn:
        record = txn.get(table.encode())  # the table's MDB_db record in the main database
    page_size = env.stat()["psize"]
    env.close()
    root = struct.unpack_from("<Q", record or b"", 40)[0]  # md_root, after pad/flags/depth and 4 counters
    with (data / "lmdb" / "data.mdb").open("r+b") as f:
        f.seek(root * page_size + 10)  # mp_flags
        f.write(b"\x00\x00")


def ok_fails(result: subprocess.CompletedProcess[bytes]) -> None:
    """No crash: an exit code (not a signal), no traceback."""
    assert result.returncode in (0, 1), result
    assert b"Traceback" not in result.stderr, result.stderr.decode()


def test_verify_names_every_damaged_session_and_undamaged_ones_keep_serving(damaged: Path) -> None:
    a_starts, b_starts = chain_starts(damaged, "a"), chain_starts(damaged, "b")
    assert len(a_starts) >= 3 and len(b_starts) >= 2, (a_starts, b_starts)
    flipped = a_starts[1] + 1  # a DELTA inside a's second chain
    deleted = b_starts[1]  # b's second chain loses its start
    flip_frame_byte(damaged, "a", flipped)
    delete_frame(damaged, "b", deleted)
    corrupt_session_record(damaged, "c")

    verify = ckpt("verify", "--data-dir", str(damaged))
    ok_fails(verify)
    err = verify.stderr.decode()
    assert verify.returncode == 1
    assert f"FAIL session 'a': frame checksum mismatch for version {flipped}" in err, err
    assert f"FAIL session 'b': version {deleted} is missing" in err, err
    assert "FAIL session 'c': " in err and "session record" in err, err
    assert "session 'd'" not in err
    assert b"verified 4 sessions: 1 ok, 3 failed" in verify.stdout
    assert ckpt("verify", "d", "--data-dir", str(damaged)).returncode == 0

    inspect_d = ckpt("inspect", "d", "--data-dir", str(damaged))
    assert inspect_d.returncode == 0 and f"versions 1..{VERSIONS}" in inspect_d.stdout.decode()
    inspect_a = ckpt("inspect", "a", "--data-dir", str(damaged))
    assert inspect_a.returncode == 0 and f"{flipped:>8} CORRUPT" in inspect_a.stdout.decode()
    inspect_c = ckpt("inspect", "c", "--data-dir", str(damaged))
    ok_fails(inspect_c)
    assert inspect_c.returncode == 1 and b"session record" in inspect_c.stderr
    stats = ckpt("stats", "--data-dir", str(damaged))
    assert stats.returncode == 0
    assert json.loads(stats.stdout)["versions"] == 4 * VERSIONS - 1

    sidecar = start_sidecar(damaged)
    try:
        with CheckpointClient(sidecar.unix_target, retries=0) as c:
            for v in range(1, VERSIONS + 1):
                assert c.get("d", v).state == expected_state("d", v)
            assert [h.version for h in c.history("d")] == list(range(VERSIONS, 0, -1))
            for v in range(1, VERSIONS + 1):
                if a_starts[1] < v and (len(a_starts) < 3 or v < a_starts[2]) and v >= flipped:
                    with pytest.raises(DataLossError, match=f"session 'a' version {v}"):
                        c.get("a", v)
                else:
                    assert c.get("a", v).state == expected_state("a", v), v
            with pytest.raises(DataLossError, match="session 'b'"):
                c.get("b", deleted)
            assert c.get("b", deleted - 1).state == expected_state("b", deleted - 1)
            assert c.get("b").state == expected_state("b", VERSIONS)
            # c's frames are whole: a read needs nothing else. A write needs the record, and is refused.
            assert c.get("c").state == expected_state("c", VERSIONS)
            with pytest.raises(DataLossError, match="session record"):
                c.put("c", b"\x08\x01")
            assert c.merge("d", merge_patch("d", VERSIONS + 1)).version == VERSIONS + 1
    finally:
        assert sidecar.stop() == 0, sidecar.log(tail_chars=3000)


# -- the offline tools: defects fixed in sidecar/cli.py --------------------------------


def test_tools_report_lmdb_page_corruption_without_a_traceback(damaged: Path) -> None:
    corrupt_root_page(damaged, "frames")
    verify = ckpt("verify", "--data-dir", str(damaged))
    ok_fails(verify)
    assert verify.returncode == 1
    err = verify.stderr.decode()
    for session in SESSIONS:  # every session is reported, not just the first
        assert f"FAIL session '{session}': " in err and "MDB_CORRUPTED" in err, err
    assert b"verified 4 sessions: 0 ok, 4 failed" in verify.stdout
    inspect = ckpt("inspect", "a", "--data-dir", str(damaged))
    ok_fails(inspect)
    assert inspect.returncode == 1 and b"MDB_CORRUPTED" in inspect.stderr
    stats = ckpt("stats", "--data-dir", str(damaged))
    ok_fails(stats)


@pytest.mark.parametrize("keep", [0, 2 * 4096, 0.5])
def test_tools_report_a_truncated_data_file_instead_of_crashing(damaged: Path, keep: float) -> None:
    data_mdb = damaged / "lmdb" / "data.mdb"
    size = data_mdb.stat().st_size
    with data_mdb.open("r+b") as f:
        f.truncate(int(size * keep) if isinstance(keep, float) else keep)
    for args in (("verify",), ("stats",), ("inspect", "a")):
        out = ckpt(*args, "--data-dir", str(damaged))
        ok_fails(out)  # SIGBUS before (exit -7), or a traceback for an empty file
        assert out.returncode == 1, (args, out)
        assert b"data.mdb" in out.stderr, (args, out.stderr)


def test_every_verify_failure_names_the_version(damaged: Path) -> None:
    cut_frame_bytes(damaged, "a", 5)
    verify = ckpt("verify", "a", "--data-dir", str(damaged))
    ok_fails(verify)
    lines = verify.stderr.decode().splitlines()
    assert verify.returncode == 1 and lines
    for line in lines:  # not "frame is 0 bytes, shorter than the 64-byte header", with no version
        assert "version 5" in line, line


def test_readonly_tools_beside_a_sidecar_deleting_and_pruning_report_no_false_failures(tmp_path: Path) -> None:
    sidecar = start_sidecar_sweeping(tmp_path / "data", 0.01, "--keep-last-versions", "2")
    stop = threading.Event()
    errors: list[str] = []

    def churn(name: int) -> None:  # sessions come and go while the tools list and read them
        with CheckpointClient(sidecar.unix_target) as c:
            n = 0
            while not stop.is_set():
                n += 1
                session = f"churn{name}_{n % 100}"
                try:
                    c.merge(session, merge_patch(session, n))
                    if n % 2:  # odd sessions come and go; even ones grow (and retention prunes them)
                        c.delete(session)
                except CheckpointError as exc:
                    errors.append(repr(exc))
                    return

    with CheckpointClient(sidecar.unix_target) as c:
        for n in range(300):
            c.merge(f"churn{n % 3}_{n // 3}", merge_patch("x", n))
    writers = [threading.Thread(target=churn, args=(name,)) for name in range(3)]
    for t in writers:
        t.start()
    try:
        runs = [ckpt("verify", "--data-dir", str(sidecar.data_dir)) for _ in range(5)]
        inspects = [ckpt("inspect", f"churn0_{n}", "--data-dir", str(sidecar.data_dir)) for n in (0, 2, 4)]
        stats = ckpt("stats", "--data-dir", str(sidecar.data_dir))
    finally:
        stop.set()
        for t in writers:
            t.join()
        assert sidecar.stop() == 0
    assert not errors, errors
    for r in runs:
        ok_fails(r)
    assert [r.returncode for r in runs] == [0] * 5, [r.stderr.decode()[:2000] for r in runs if r.returncode]
    for r in inspects:  # even sessions are never deleted
        assert r.returncode == 0, r.stderr
    assert stats.returncode == 0 and json.loads(stats.stdout)["sessions"] >= 150


# -- a sidecar serving damaged data ----------------------------------------------------


def serve_damaged(data: Path) -> Sidecar:
    return start_sidecar(data)


def test_a_frame_without_its_bytes_is_data_loss(damaged: Path) -> None:
    """A stored value too short to hold a frame header (here: its metadata length prefix overruns the
    value) is DATA_LOSS naming the session and version, for Get of that version or a later one in its
    chain and for Fork from it (not INTERNAL, "failed inside the sidecar")."""
    starts = chain_starts(damaged, "a")
    broken = starts[0] + 1  # inside a's first chain: reached by the read back from a later version
    cut_frame_bytes(damaged, "a", broken)
    sidecar = serve_damaged(damaged)
    try:
        with CheckpointClient(sidecar.unix_target, retries=0) as c:
            assert c.get("a", starts[0]).state == expected_state("a", starts[0])
            same_chain = [broken] + [
                v for v in (broken + 1,) if v not in starts
            ]  # a chain start needs no version before it
            for v in same_chain:
                with pytest.raises(DataLossError, match=f"session 'a'.*version {broken}"):
                    c.get("a", v)
            with pytest.raises(DataLossError, match="session 'a'"):
                c.fork("a", "a-retry", version=broken)
    finally:
        assert sidecar.stop() == 0


def test_a_frame_without_its_bytes_does_not_stop_retention_of_the_others(damaged: Path) -> None:
    """Retention skips a session whose chain holds a value too short for a frame header, and prunes the
    others of its chunk (a prune op covers up to 1,000 sessions): the sweep goes on, every time."""
    starts = chain_starts(damaged, "a")
    broken = max(set(range(1, VERSIONS + 1)) - set(starts))  # not a chain start
    cut_frame_bytes(damaged, "a", broken)
    # Keep the newest versions from `broken` on: the sweep reads back from it to its chain start.
    retention = Retention(keep_last_versions=VERSIONS - broken + 1)
    config = StoreConfig(data_dir=damaged, retention=retention, sweep_interval_seconds=3600)
    with Store(config) as store:
        result = store.sweep()
        assert result.sessions_pruned == 3  # b, c, d; a is kept as it is, for verify to name
        for session in "bcd":
            assert store.session(session).first_version > 1
        assert store.session("a").first_version == 1


def test_one_corrupt_session_record_does_not_fail_listings(damaged: Path) -> None:
    """A session record that does not parse is left out of ListSessions (as the sweeper and verify skip
    it), so the undamaged sessions are still listed."""
    corrupt_session_record(damaged, "b")
    sidecar = serve_damaged(damaged)
    try:
        with CheckpointClient(sidecar.unix_target, retries=0) as c:
            assert c.get("a").version == VERSIONS  # undamaged sessions serve
            listed = [s.session_id for s in c.sessions()]
            assert {"a", "c", "d"} <= set(listed)
    finally:
        assert sidecar.stop() == 0


def test_a_session_with_a_corrupt_record_can_be_deleted(damaged: Path) -> None:
    """DeleteSession removes a session whose record does not parse (its index entries found by a scan):
    it is the operator's one way to drop a damaged session and start it over."""
    corrupt_session_record(damaged, "b")
    sidecar = serve_damaged(damaged)
    try:
        with CheckpointClient(sidecar.unix_target, retries=0) as c:
            with pytest.raises(DataLossError):
                c.merge("b", merge_patch("b", VERSIONS + 1))
            assert c.get("b").state == expected_state("b", VERSIONS)  # its frames are whole
            assert c.delete("b") == VERSIONS
            with pytest.raises(NotFoundError):
                c.get("b")
            assert c.put("b", b"\x08\x01").version == 1  # started over
    finally:
        assert sidecar.stop() == 0
    assert ckpt("verify", "--data-dir", str(damaged)).returncode == 0


def test_a_corrupt_request_record_is_data_loss_and_does_not_block_delete(damaged: Path) -> None:
    """A request record that does not parse is DATA_LOSS for a retry with its request id (whether that write
    was made is unknown), not INTERNAL; DeleteSession of its session still works (a delete leaves current
    request records to expire, and removes only store layout 1's, keyed by session). `ckpt verify` names
    the record (requests table) when it cross-checks the tables."""
    corrupt_request_record(damaged, "c", "c:3")
    sidecar = serve_damaged(damaged)
    try:
        with CheckpointClient(sidecar.unix_target, retries=0) as c:
            assert c.get("c", 3).state == expected_state("c", 3)
            with pytest.raises(DataLossError, match="c:3"):
                c.put("c", replace_state("c", 3), request_id="c:3")
            assert c.delete("c") == VERSIONS
    finally:
        assert sidecar.stop() == 0


def test_lmdb_page_corruption_is_data_loss(damaged: Path) -> None:
    """A damaged B-tree page (MDB_CORRUPTED) is DATA_LOSS for reads and writes, as docs/errors.md promises for
    stored data that fails its checks (not INTERNAL, "see its log")."""
    corrupt_root_page(damaged, "frames")
    sidecar = serve_damaged(damaged)
    try:
        with CheckpointClient(sidecar.unix_target, retries=0) as c:
            assert {s.session_id for s in c.sessions()} == set(SESSIONS)  # the sessions table is intact
            with pytest.raises(DataLossError):
                c.get("a")
            with pytest.raises(DataLossError):
                list(c.history("a"))
    finally:
        assert sidecar.stop() == 0


def test_a_sidecar_on_a_truncated_data_file_refuses_to_start_or_survives(damaged: Path) -> None:
    """A data.mdb shorter than the pages its meta page says are in use is refused at the start, naming the
    file (as `ckpt verify` names it), or answered DATA_LOSS while the sidecar keeps serving: never a read
    of a missing page that kills the sidecar with SIGBUS and drops every client."""
    data_mdb = damaged / "lmdb" / "data.mdb"
    with data_mdb.open("r+b") as f:
        f.truncate(data_mdb.stat().st_size // 2)
    try:
        sidecar = serve_damaged(damaged)
    except RuntimeError as exc:  # refused to start: the log must say why
        assert "data.mdb" in str(exc)
        return
    try:
        with CheckpointClient(sidecar.unix_target, retries=0) as c:
            for call in (lambda: list(c.sessions()), lambda: c.get("a"), lambda: c.get("d", 1)):
                with contextlib.suppress(CheckpointError):  # an error is fine; dying is not
                    call()
        assert sidecar.process.poll() is None, f"the sidecar died: exit {sidecar.process.returncode}"
    finally:
        sidecar.stop(signal.SIGKILL)


def test_a_session_key_that_is_not_utf8_is_reported_not_fatal(damaged: Path) -> None:
    """A session key that is not UTF-8 is reported by `ckpt verify`, which checks the sessions after it; it
    fails neither ListSessions nor the sweeps of its chunk."""
    db = Lmdb(damaged)
    with db as txn:
        txn.put(b"\xff\xfe", txn.get(b"a", db=db.db["sessions"]) or b"", db=db.db["sessions"])
    verify = ckpt("verify", "--data-dir", str(damaged))
    ok_fails(verify)
    assert verify.returncode == 1 and b"verified 5 sessions: 4 ok, 1 failed" in verify.stdout, verify
    sidecar = serve_damaged(damaged)
    try:
        with CheckpointClient(sidecar.unix_target, retries=0) as c:
            assert set(SESSIONS) <= {s.session_id for s in c.sessions()}
    finally:
        assert sidecar.stop() == 0


def test_history_names_a_missing_version(damaged: Path) -> None:
    """History answers DATA_LOSS naming a version whose frame is gone, as Get does, rather than list the
    versions that remain and disagree with the session's version_count quietly."""
    delete_frame(damaged, "d", 9)
    sidecar = serve_damaged(damaged)
    try:
        with CheckpointClient(sidecar.unix_target, retries=0) as c:
            with pytest.raises(DataLossError):
                c.get("d", 9)
            with pytest.raises(DataLossError, match="9"):
                list(c.history("d"))
    finally:
        assert sidecar.stop() == 0


_SHORT_TAIL_SCRIPT = """
import sys
from pathlib import Path
from ckpt.sidecar.errors import DataLoss
from ckpt.sidecar.store.engine import Store
from ckpt.sidecar.config import StoreConfig
data = Path(sys.argv[1])
try:
    with Store(StoreConfig(data_dir=data)) as store:
        print("opened", [store.get(f"s{i}").version for i in range(50)])
except DataLoss as exc:
    print("refused", exc)
"""


def test_a_data_file_a_page_short_of_a_page_in_use_is_refused_not_served(tmp_path: Path) -> None:
    """A data file cut by a single page its database uses is refused at every open, by the writer and by
    `ckpt verify`, naming the file: not grown with zeros and served until a read meets the lost page (or
    read past the end of the mapped file, SIGBUS). Pages LMDB counted but never wrote are free, and a
    file short of those alone opens (test_unwritten_tail.py). Run in a child process for SIGBUS."""
    data = tmp_path / "data"
    with Store(StoreConfig(data_dir=data)) as store:
        for i in range(50):
            store.put(f"s{i}", os.urandom(3000))
    data_mdb = data / "lmdb" / "data.mdb"
    size = data_mdb.stat().st_size
    with data_mdb.open("r+b") as f:
        f.truncate(size - 4096)
    verify = ckpt("verify", "--data-dir", str(data))
    assert verify.returncode == 1 and b"data.mdb is truncated" in verify.stderr, verify
    run = subprocess.run(
        [sys.executable, "-c", _SHORT_TAIL_SCRIPT, str(data)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr  # -7 would be SIGBUS
    assert "refused" in run.stdout and "data.mdb is truncated" in run.stdout, run.stdout
    assert data_mdb.stat().st_size == size - 4096  # not grown
