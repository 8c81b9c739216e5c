"""Backups (`ckpt backup`, sidecar.backup): a consistent copy made beside a running sidecar, served as a data dir."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ckpt.sidecar import PutRequest, Store, StoreConfig
from ckpt.sidecar.client import CheckpointClient, event
from ckpt.sidecar.tools.backup import backup, write_backup
from ckpt.v1 import checkpoint_pb2 as pb
from tests.support import ROOT, ckpt, start_sidecar

SESSIONS = [f"agent-{n:02d}" for n in range(24)]


def state_of(session: str, version: int) -> bytes:
    """What the test writes as ``version`` of ``session`` (distinct per version, ~2 KB)."""
    return pb.Checkpoint(step=version, goal=f"{session} v{version} " + "plan " * 400).SerializeToString()


def no_partials(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".partial-" in p.name]


def test_backup_beside_a_running_sidecar_under_load_is_one_snapshot_and_serves(tmp_path: Path) -> None:
    """A writer puts round-robin over the sessions (version n of every session, in order, then n+1) while
    `ckpt backup` runs: the backup's heads must be a prefix of that order (a torn copy is not), hold every
    write acknowledged before the backup began, and read back byte for byte from a sidecar serving it."""
    data = tmp_path / "data"
    with Store(StoreConfig(data_dir=data)) as store:  # ~20 MB, so that the copy itself takes a while
        store.put_many([PutRequest(f"ballast-{n:03d}", os.urandom(100_000)) for n in range(200)])
    live = start_sidecar(data)
    acked: list[tuple[str, int]] = []  # every acknowledged write, in the order written
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            with CheckpointClient(live.unix_target) as client:
                version = 1
                while not stop.is_set() or version < 4:
                    for session in SESSIONS:
                        assert client.put(session, state_of(session, version)).version == version
                        acked.append((session, version))
                    version += 1
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while len(acked) < 3 * len(SESSIONS) and thread.is_alive():
            stop.wait(0.01)
        acked_before = len(acked)
        result = ckpt("backup", "--data-dir", str(data), str(tmp_path / "backup"))
        acked_after = len(acked)
    finally:
        stop.set()
        thread.join(60)
        assert live.stop() == 0
    assert not errors, errors
    assert result.returncode == 0, result.stderr.decode()
    summary = json.loads(result.stdout)
    assert summary["backup"] == str(tmp_path / "backup") and summary["sessions"] == len(SESSIONS) + 200
    assert acked_after > acked_before, "no write landed while the backup ran: the test shows nothing"

    restored = start_sidecar(tmp_path / "backup")
    try:
        with CheckpointClient(restored.unix_target) as client:
            heads = {s: client.get(s).version for s in SESSIONS}
            # One snapshot of a round-robin writer: the first sessions are at most one version ahead.
            in_backup = sum(heads.values())
            assert summary["versions"] == in_backup + 200
            assert {s: max(v for s2, v in acked[:in_backup] if s2 == s) for s in SESSIONS} == heads
            assert in_backup >= acked_before  # every write acknowledged before the backup began
            for session, head in heads.items():
                for version in range(1, head + 1):
                    got = client.get(session, version)
                    assert got.state == state_of(session, version), (session, version)
            # A backup is a data directory the sidecar writes on from where it stands.
            assert client.put(SESSIONS[0], b"\x08\x07").version == heads[SESSIONS[0]] + 1
    finally:
        assert restored.stop() == 0
    verify = ckpt("verify", "--data-dir", str(tmp_path / "backup"))
    assert verify.returncode == 0, verify.stderr.decode()
    assert no_partials(tmp_path) == []


def test_backup_from_an_open_store_holds_what_was_committed_before_it(tmp_path: Path) -> None:
    """The embedded API: sidecar.backup.backup(store, dest) while the store takes writes."""
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        store.put_many([PutRequest(s, state_of(s, 1)) for s in SESSIONS])
        store.fork(SESSIONS[0], 0, "forked")
        store.delete_session(SESSIONS[1])
        result = backup(store, tmp_path / "backup")
        store.put_many([PutRequest(s, state_of(s, 2)) for s in SESSIONS])  # after: not in the backup
    assert (result.sessions, result.versions) == (len(SESSIONS), len(SESSIONS))  # one deleted, one forked
    assert result.data_mdb_bytes == (tmp_path / "backup" / "lmdb" / "data.mdb").stat().st_size
    with Store(StoreConfig(data_dir=tmp_path / "backup")) as copy:
        assert sorted(copy.session_ids()) == sorted([*SESSIONS[:1], *SESSIONS[2:], "forked"])
        for session in [*SESSIONS[:1], *SESSIONS[2:]]:
            got = copy.get(session)
            assert (got.version, got.state) == (1, state_of(session, 1))
        assert copy.session("forked").forked_from_session_id == SESSIONS[0]


def test_backup_is_smaller_than_a_file_with_free_pages(tmp_path: Path) -> None:
    """Deleted sessions leave free pages in data.mdb; the backup leaves them out."""
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        store.put_many([PutRequest(f"s{n}", os.urandom(20_000)) for n in range(200)])
        for n in range(190):
            store.delete_session(f"s{n}")
        result = backup(store, tmp_path / "backup")
    assert result.sessions == 10
    assert result.data_mdb_bytes * 4 < (tmp_path / "data" / "lmdb" / "data.mdb").stat().st_size


@pytest.mark.parametrize(
    ("dest", "message"),
    [
        ("exists", b"the backup destination already exists"),
        ("no-parent/backup", b"the backup destination's parent directory does not exist"),
    ],
)
def test_backup_refuses_a_destination_it_cannot_create(tmp_path: Path, dest: str, message: bytes) -> None:
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        store.put("s", b"\x08\x01")
    (tmp_path / "exists").mkdir()
    (tmp_path / "exists" / "keep").write_bytes(b"mine")
    result = ckpt("backup", "--data-dir", str(tmp_path / "data"), str(tmp_path / dest))
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert str(tmp_path / dest).encode() in result.stderr or b"no-parent" in result.stderr
    assert b"[Errno" not in result.stderr, result.stderr  # said as a sentence, not as Python prints an OSError
    assert (tmp_path / "exists" / "keep").read_bytes() == b"mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "exists"]


@pytest.mark.parametrize(
    ("dest", "code", "message"),
    [
        ("", 2, b"argument dest: DEST is empty; name a new directory"),
        ("{data}/lmdb/backup", 2, b"is inside LMDB's own directory"),
        ("/proc/ckpt-backup", 1, b"cannot write a backup in /proc ("),
    ],
)
def test_backup_names_what_is_wrong_with_its_destination(tmp_path: Path, dest: str, code: int, message: bytes) -> None:
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        store.put("s", b"\x08\x01")
    result = ckpt("backup", "--data-dir", str(tmp_path / "data"), dest.format(data=tmp_path / "data"))
    assert result.returncode == code and message in result.stderr, result.stderr
    assert b".partial-" not in result.stderr and b"Traceback" not in result.stderr
    assert sorted(p.name for p in (tmp_path / "data" / "lmdb").iterdir()) == ["data.mdb", "lock.mdb"]


def test_backup_of_a_directory_without_a_store_names_it(tmp_path: Path) -> None:
    result = ckpt("backup", "--data-dir", str(tmp_path / "nothing"), str(tmp_path / "backup"))
    assert result.returncode == 1
    assert result.stderr.decode().startswith(f"ckpt backup: no ckpt store in {tmp_path / 'nothing'}")
    assert not (tmp_path / "backup").exists() and no_partials(tmp_path) == []


def test_a_copy_that_cannot_be_written_leaves_nothing(tmp_path: Path) -> None:
    """A write that fails mid-copy (a file size limit, as a full disk would): exit 1, no backup, no partial."""
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        store.put_many([PutRequest(f"s{n}", os.urandom(50_000)) for n in range(20)])

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, resource.RLIM_INFINITY))

    result = subprocess.run(
        [sys.executable, "-m", "ckpt.sidecar.cli", "backup", "--data-dir", str(tmp_path / "data"), str(tmp_path / "b")],
        capture_output=True,
        cwd=ROOT,
        timeout=60,
        preexec_fn=limit_file_size,
    )
    err = result.stderr.decode()
    assert result.returncode == 1 and err.startswith("ckpt backup: copying the store failed: "), err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


def test_a_copy_stopped_by_an_exception_is_removed(tmp_path: Path) -> None:
    """SIGTERM/SIGHUP reach write_backup as SystemExit (ckpt backup's handlers): the partial copy goes."""

    def copy(lmdb_dir: Path) -> tuple[int, int]:
        (lmdb_dir / "data.mdb").write_bytes(b"half")
        raise SystemExit(143)

    with pytest.raises(SystemExit):
        write_backup(tmp_path / "backup", copy)
    assert list(tmp_path.iterdir()) == []


_KILLED_MID_COPY = """
import os, signal, sys
from pathlib import Path
from ckpt.sidecar.tools.backup import write_backup

def copy(lmdb_dir):
    (lmdb_dir / "data.mdb").write_bytes(b"half")
    os.kill(os.getpid(), signal.SIGKILL)

write_backup(Path(sys.argv[1]), copy)
"""

_WRITING = """
import sys, time
from pathlib import Path
from ckpt.sidecar.tools.backup import write_backup

def copy(lmdb_dir):
    print("copying", flush=True)
    sys.stdin.readline()  # until the test says so
    raise SystemExit(0)

write_backup(Path(sys.argv[1]), copy)
"""


def test_a_copy_abandoned_by_a_killed_backup_is_removed_by_the_next_one_not_one_being_written(tmp_path: Path) -> None:
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        store.put("s", b"\x08\x01")
    out = tmp_path / "out"
    out.mkdir()
    killed = subprocess.run([sys.executable, "-c", _KILLED_MID_COPY, str(out / "nightly")], cwd=ROOT, timeout=60)
    assert killed.returncode == -9
    (abandoned,) = no_partials(out)
    writing = subprocess.Popen(
        [sys.executable, "-c", _WRITING, str(out / "nightly")],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writing.stdout is not None and writing.stdout.readline() == "copying\n"
        # The backup being written started after the killed one: it removed the abandoned copy already.
        assert abandoned not in no_partials(out) and len(no_partials(out)) == 1
        (other,) = no_partials(out)
        (out / "nightly-2").mkdir()  # another destination's name: never touched
        result = ckpt("backup", "--data-dir", str(tmp_path / "data"), str(out / "nightly"))
        assert result.returncode == 0, result.stderr
        assert no_partials(out) == [other]  # still being written: left alone
    finally:
        assert writing.stdin is not None
        writing.stdin.write("\n")
        writing.stdin.close()
        writing.wait(60)
        assert writing.stdout is not None
        writing.stdout.close()
    assert sorted(p.name for p in out.iterdir()) == ["nightly", "nightly-2"]


def test_a_backup_stopped_by_sigterm_leaves_no_partial_copy(tmp_path: Path) -> None:
    """Whenever SIGTERM lands (mid-copy, as a rule, with ~60 MB to copy), there is a whole backup or nothing."""
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        store.put_many([PutRequest(f"s{n}", os.urandom(1_000_000)) for n in range(60)])
    out = tmp_path / "out"
    out.mkdir()
    backup_process = subprocess.Popen(
        [sys.executable, "-m", "ckpt.sidecar.cli", "backup", "--data-dir", str(tmp_path / "data"), str(out / "b")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while not no_partials(out) and backup_process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    backup_process.send_signal(signal.SIGTERM)
    _, err = backup_process.communicate(timeout=60)
    assert b"Traceback" not in err, err
    if backup_process.returncode == 0:  # it finished first
        assert [p.name for p in out.iterdir()] == ["b"]
    else:
        assert backup_process.returncode == 128 + signal.SIGTERM, err
        assert list(out.iterdir()) == []


def test_a_destination_name_as_long_as_a_file_name_may_be(tmp_path: Path) -> None:
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        store.put("s", b"\x08\x01")
    name = "b" * 255
    result = ckpt("backup", "--data-dir", str(tmp_path / "data"), str(tmp_path / name))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / name / "lmdb" / "data.mdb").is_file() and no_partials(tmp_path) == []


def test_a_backup_carries_the_event_logs_and_a_sidecar_serves_them(tmp_path: Path) -> None:
    """Events are in the data directory's tables like versions: the backup holds every log as it was,
    `ckpt verify` checks its blocks, and a sidecar serving the backup reads and appends to them."""
    data = tmp_path / "data"
    live = start_sidecar(data)
    try:
        with CheckpointClient(live.unix_target) as client:
            client.append_events("with-state", [event("tool", b"%d" % i) for i in range(700)])
            client.put("with-state", b"\x08\x01")
            client.append_events("events-only", [event("note", b"only")])
            done = ckpt("backup", str(tmp_path / "backup"), "--data-dir", str(data))
            assert done.returncode == 0, done.stderr
            client.append_events("with-state", [event("after-the-backup")])
    finally:
        assert live.stop() == 0, live.log()
    verify = ckpt("verify", "--data-dir", str(tmp_path / "backup"))
    assert verify.returncode == 0, verify.stderr
    restored = start_sidecar(tmp_path / "backup")
    try:
        with CheckpointClient(restored.unix_target) as client:
            assert [e.payload for e in client.events("with-state", page_size=1000)] == [b"%d" % i for i in range(700)]
            assert [e.payload for e in client.events("events-only")] == [b"only"]
            assert client.append_events("with-state", [event("next")]).first_seq == 701
    finally:
        assert restored.stop() == 0, restored.log()


# `ckpt backup`, its copy's first step (in the forked child that copies) hanging up its whole process group,
# as a closed terminal does.
_HUNG_UP_MID_COPY = """
import os, signal, sys
from ckpt.sidecar.cli import offline_commands
from ckpt.sidecar.cli.main import main

copy_with_blobs = offline_commands.copy_with_blobs


def hung_up(*args, **kwargs):
    os.killpg(0, signal.SIGHUP)
    return copy_with_blobs(*args, **kwargs)


offline_commands.copy_with_blobs = hung_up
sys.exit(main(["backup", *sys.argv[1:]]))
"""


def test_a_backup_started_by_nohup_finishes_through_a_sighup(tmp_path: Path) -> None:
    """nohup starts it with SIGHUP ignored: a closed terminal mid-copy stops neither it nor its copying child."""
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        store.put_many([PutRequest(f"s{n}", b"\x08\x01") for n in range(3)])
    result = subprocess.run(
        ["nohup", sys.executable, "-c", _HUNG_UP_MID_COPY, "--data-dir", str(tmp_path / "data"), str(tmp_path / "b")],
        cwd=ROOT,
        capture_output=True,
        timeout=60,
        start_new_session=True,  # the process group it hangs up: its own
    )
    assert result.returncode == 0, result.stderr.decode()
    assert json.loads(result.stdout)["sessions"] == 3
    with Store(StoreConfig(data_dir=tmp_path / "b"), readonly=True) as copy:
        assert copy.get("s2").state == b"\x08\x01"
