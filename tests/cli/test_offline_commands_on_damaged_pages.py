"""The offline tools on B-tree pages that make LMDB abort() or crash, run as a user runs them.

The LMDB C library checks some page invariants with assertions: a leaf page
whose flags no longer say leaf, a branch page left with one key, a node
offset past the end of data.mdb killed `ckpt verify` / `ckpt inspect` with
SIGABRT ("mdb.c:NNNN: Assertion ... failed") or SIGBUS, printing neither a
report nor the other sessions' results. Every test here failed before the
reads moved into a child process (sidecar/tools/isolated.py): the tool died of the
signal (exit -6 or -7).

The directory is written through sidecar.store.Store, closed, then damaged
byte by byte at pages found by following its B-trees (LMDB 0.9 layout, 64-bit).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import lmdb
import pytest

from ckpt.codec import ChainPolicy
from ckpt.sidecar import PutRequest, Store, StoreConfig
from ckpt.sidecar.client import CheckpointClient, DataLossError
from ckpt.v1 import checkpoint_pb2 as pb
from tests.support import HEADER, IS_LEAF, NUMKEYS, Pages, ckpt, start_sidecar

SESSIONS = [f"s{n:04d}" for n in range(300)]
VERSIONS = 4


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """300 sessions of 4 versions: the frames and sessions tables each have a branch root over several leaves."""
    data = tmp_path_factory.mktemp("pristine") / "data"
    # Every version a FULL frame: a read of a session's head then reads its own key alone.
    with Store(StoreConfig(data_dir=data, chain_policy=ChainPolicy(max_depth=0))) as store:
        for v in range(1, VERSIONS + 1):
            store.put_many(
                [
                    PutRequest(s, pb.Checkpoint(step=v, goal=f"{s} goal " + "x" * 300).SerializeToString())
                    for s in SESSIONS
                ]
            )
    return data


@pytest.fixture
def damaged(pristine: Path, tmp_path: Path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(pristine, data)
    return data


def session_of(key: bytes) -> str:
    return key.partition(b"\x00")[0].decode()


def survived(result: subprocess.CompletedProcess[bytes]) -> str:
    """The tool exited 1 by itself (no signal, no traceback); its stderr."""
    err = result.stderr.decode()
    assert result.returncode == 1, (result.returncode, err[-2000:])
    assert "Traceback" not in err, err
    return err


def fails(err: str) -> dict[str, str]:
    """FAIL lines by session."""
    out = {}
    for line in err.splitlines():
        if line.startswith("FAIL session '"):
            session, _, problem = line[len("FAIL session '") :].partition("': ")
            out[session] = problem
    return out


def test_verify_reports_the_session_lmdb_aborts_on_in_a_frames_leaf_and_checks_the_rest(damaged: Path) -> None:
    """A frames leaf whose flags are cleared: reading into it from the leaf before, LMDB asserts IS_LEAF (SIGABRT)."""
    pages = Pages(damaged)
    leaves = pages.leaves("frames")
    pgno, keys = leaves[len(leaves) // 2]
    aborted = session_of(leaves[len(leaves) // 2 - 1][1][-1])  # its cursor steps into the damaged leaf
    inside = {session_of(k) for k in keys} - {aborted}
    pages.put(pgno, 10, "<H", 0)
    pages.write()

    verify = ckpt("verify", "--data-dir", str(damaged))
    err = survived(verify)
    failed = fails(err)
    assert re.fullmatch(
        re.escape(f"{damaged}/lmdb/data.mdb: LMDB aborted (SIGABRT: ")
        + IS_LEAF
        + re.escape(f") while reading session '{aborted}'"),
        failed[aborted],
    ), err
    for session in inside:  # these land on the damaged leaf directly: MDB_CORRUPTED, as before
        assert "MDB_CORRUPTED" in failed[session], err
    assert set(failed) == inside | {aborted}, err
    n = len(failed)
    assert f"verified {len(SESSIONS)} sessions: {len(SESSIONS) - n} ok, {n} failed\n" == verify.stdout.decode()

    inspect = ckpt("inspect", aborted, "--data-dir", str(damaged))
    assert re.fullmatch(
        re.escape(f"ckpt inspect: {damaged}/lmdb/data.mdb: LMDB aborted (SIGABRT: ")
        + IS_LEAF
        + re.escape(f") while reading session '{aborted}'"),
        survived(inspect).strip(),
    )
    assert inspect.stdout == b""
    ok = ckpt("inspect", SESSIONS[0], "--data-dir", str(damaged))
    assert ok.returncode == 0 and f"session {SESSIONS[0]}: versions 1..{VERSIONS}" in ok.stdout.decode()


def test_verify_goes_on_when_every_read_of_the_frames_table_aborts(damaged: Path) -> None:
    """A frames branch left with one key: every search of the table asserts NUMKEYS > 1, one child per session."""
    pages = Pages(damaged)
    pages.put(pages.root("frames"), 12, "<H", HEADER + 2)  # lower: one node
    pages.write()

    verify = ckpt("verify", "--data-dir", str(damaged))
    failed = fails(survived(verify))
    assert set(failed) == set(SESSIONS)
    for session, problem in failed.items():
        assert re.search(r"LMDB aborted \(SIGABRT: " + NUMKEYS + r"\) while reading session", problem), problem
        assert problem.endswith(f"while reading session '{session}'")
    assert verify.stdout == f"verified {len(SESSIONS)} sessions: 0 ok, {len(SESSIONS)} failed\n".encode()
    # Sessions named on the command line: each reported, the last one too.
    some = ckpt("verify", SESSIONS[3], SESSIONS[7], "--data-dir", str(damaged))
    assert set(fails(survived(some))) == {SESSIONS[3], SESSIONS[7]}
    assert some.stdout == b"verified 2 sessions: 0 ok, 2 failed\n"
    inspect = ckpt("inspect", SESSIONS[5], "--data-dir", str(damaged))
    assert f"while reading session '{SESSIONS[5]}'" in survived(inspect) and "SIGABRT" in inspect.stderr.decode()


def test_verify_reports_a_node_pointing_past_the_end_of_the_file(damaged: Path) -> None:
    """A node offset pointing past data.mdb's end: LMDB reads the mapping beyond the file (SIGBUS)."""
    pages = Pages(damaged)
    size = len(pages.buf)
    leaves = pages.leaves("frames")
    # A leaf near the end of the file, where a 16-bit node offset reaches past it.
    at, (pgno, keys) = next(
        (i, leaf) for i, leaf in reversed(list(enumerate(leaves))) if leaf[0] * pages.psize + 0xFFF0 > size
    )
    # The sessions whose reads meet the damaged node: those with keys in this
    # leaf, and one whose frames begin the next leaf (its read searches from
    # below its first key, which the branch routes into this leaf).
    reach = {session_of(k) for k in keys} | ({session_of(leaves[at + 1][1][0])} if at + 1 < len(leaves) else set())
    index = len(keys) // 2
    pages.put(pgno, HEADER + 2 * index, "<H", 0xFFF0)
    pages.write()

    verify = ckpt("verify", "--data-dir", str(damaged))
    failed = fails(survived(verify))
    crashed = [s for s, problem in failed.items() if "LMDB crashed (SIGBUS" in problem]
    assert crashed and set(crashed) <= reach, failed
    for session in crashed:
        assert failed[session] == (
            f"{damaged}/lmdb/data.mdb: LMDB crashed (SIGBUS: a damaged page points past the end of the file)"
            f" while reading session '{session}'"
        )
    assert f"verified {len(SESSIONS)} sessions: {len(SESSIONS) - len(failed)} ok" in verify.stdout.decode()


def test_verify_lists_the_sessions_past_a_sessions_leaf_lmdb_aborts_on(damaged: Path) -> None:
    """A sessions leaf whose flags are cleared: listing the sessions table asserts IS_LEAF (SIGABRT); the sessions
    after it are listed from the frames table, those whose records were on the leaf fail, the others pass."""
    pages = Pages(damaged)
    leaves = pages.leaves("sessions")
    pgno, keys = leaves[1]
    pages.put(pgno, 10, "<H", 0)
    pages.write()
    lost = {k.decode() for k in keys}

    verify = ckpt("verify", "--data-dir", str(damaged))
    err = survived(verify)
    assert re.search(
        re.escape(f"FAIL listing sessions from the start: {damaged}/lmdb/data.mdb: LMDB aborted (SIGABRT: ")
        + IS_LEAF
        + re.escape("); listing them from the frames table instead\n"),
        err,
    ), err
    failed = fails(err)
    assert set(failed) == lost, err
    for problem in failed.values():
        assert "MDB_CORRUPTED" in problem
    assert verify.stdout.decode() == (
        f"verified {len(SESSIONS)} sessions: {len(SESSIONS) - len(lost)} ok, {len(lost)} failed;"
        " listing the sessions failed (see above)\n"
    )


def test_verify_goes_on_when_every_lookup_in_the_sessions_table_aborts(damaged: Path) -> None:
    """A sessions branch left with one key: listing and every record lookup assert NUMKEYS > 1."""
    pages = Pages(damaged)
    pages.put(pages.root("sessions"), 12, "<H", HEADER + 2)
    pages.write()

    verify = ckpt("verify", "--data-dir", str(damaged))
    err = survived(verify)
    assert "FAIL listing sessions from the start: " in err and "listing them from the frames table instead" in err
    failed = fails(err)
    assert set(failed) == set(SESSIONS)
    assert all(re.search(NUMKEYS, problem) for problem in failed.values()), failed
    assert verify.stdout.decode().startswith(f"verified {len(SESSIONS)} sessions: 0 ok, {len(SESSIONS)} failed")


def test_verify_beside_a_sidecar_leaves_no_dead_readers_in_the_lock_file(damaged: Path) -> None:
    """A process killed inside a read transaction keeps its slot in lock.mdb's reader table while another process
    (the sidecar) holds the environment: the slot pins the snapshot it read, so the sidecar cannot reuse pages freed
    since, and each dead reader takes a slot until the table is full. Verify frees the slots its children leave."""
    pages = Pages(damaged)
    pages.put(pages.root("frames"), 12, "<H", HEADER + 2)
    pages.write()
    sidecar = start_sidecar(damaged)
    try:
        verify = ckpt("verify", *SESSIONS[:40], "--data-dir", str(damaged))
        assert len(fails(survived(verify))) == 40
        env = lmdb.open(str(damaged / "lmdb"), max_dbs=8, readonly=True)
        readers = env.readers()
        env.close()
        pids = {int(line.split()[0]) for line in readers.splitlines()[1:] if line.split()}
        dead = {pid for pid in pids if not _alive(pid)}
        assert not dead, readers
    finally:
        assert sidecar.stop() == 0, sidecar.log(tail_chars=3000)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_table_root_lmdb_cannot_read_is_data_loss_for_clients_and_named_damage_by_the_tools(damaged: Path) -> None:
    """A frames root page whose node count is past its end: opening a cursor marks the transaction failed
    without saying why, and the first read raises MDB_BAD_TXN. Clients got INTERNAL, the tools a bare
    MDB_BAD_TXN; both now say the file is damaged (DATA_LOSS for clients)."""
    pages = Pages(damaged)
    pages.put(pages.root("frames"), 12, "<H", 4000)  # lower: past the page's upper bound
    pages.write()
    damage = "the LMDB data file is damaged (mdb_cursor_get: MDB_BAD_TXN"
    sidecar = start_sidecar(damaged)
    try:
        with CheckpointClient(sidecar.unix_target, retries=0) as client:
            for call in (
                lambda: client.get(SESSIONS[1]),  # a cache miss: read from LMDB
                lambda: list(client.history(SESSIONS[1])),
                lambda: client.put(SESSIONS[1], b"\x08\x05"),
            ):
                with pytest.raises(DataLossError, match=re.escape(damage)):
                    call()
    finally:
        assert sidecar.stop() == 0, sidecar.log(tail_chars=3000)
    assert "Traceback" not in sidecar.log()
    verify = ckpt("verify", SESSIONS[1], "--data-dir", str(damaged))
    assert fails(survived(verify))[SESSIONS[1]].startswith(damage)
    inspect = ckpt("inspect", SESSIONS[1], "--data-dir", str(damaged))
    assert damage in survived(inspect)


def test_backup_of_a_damaged_file_fails_and_leaves_nothing(damaged: Path, tmp_path: Path) -> None:
    """A frames leaf whose flags are cleared: LMDB's copy crashes on it. ckpt backup reports that damage
    (exit 1, no traceback), creates no backup and leaves no partial copy, and the source is untouched."""
    pages = Pages(damaged)
    leaves = pages.leaves("frames")
    pages.put(leaves[len(leaves) // 2][0], 10, "<H", 0)
    pages.write()
    before = pages.path.read_bytes()
    dest = tmp_path / "backup"
    err = survived(ckpt("backup", "--data-dir", str(damaged), str(dest)))
    assert re.fullmatch(
        re.escape(f"ckpt backup: {damaged}/lmdb/data.mdb: LMDB ")
        + r"(aborted|crashed) \(SIG[A-Z]+[:)].*"
        + re.escape(f" while copying it into {dest}\n"),
        err,
        re.DOTALL,
    ), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]
    assert pages.path.read_bytes() == before
