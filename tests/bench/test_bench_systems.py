"""The benchmark's systems store and return every version correctly, hot, cold
after reopen, and under concurrent writers (bench/harness/systems/)."""

from __future__ import annotations

import contextlib
import os
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckpt.bench.harness import systems
from ckpt.bench.harness.systems.langgraph_savers import checkpoint_id
from ckpt.bench.output import proc_cpu_seconds, process_and_children
from ckpt.bench.trajectories import Step
from ckpt.v1 import checkpoint_pb2 as pb

# (name, mode): mode only matters to the ckpt systems.
CASES = [
    ("ckpt-embedded", "merge"),
    ("ckpt-embedded", "replace"),
    ("ckpt-sidecar", "merge"),
    ("ckpt-sidecar", "replace"),
    ("json-sqlite", "merge"),
    ("pbzstd-lmdb", "merge"),
    ("langgraph-sqlite", "merge"),
    ("langgraph-lmdb", "merge"),
    ("langgraph-memory", "merge"),
]
IDS = [f"{name}-{mode}" if name.startswith("ckpt-") else name for name, mode in CASES]


def session_steps(seed: int) -> list[Step]:
    """Three versions of a small agent state; each patch merged onto the previous state gives the next."""
    patches = []
    first = pb.Checkpoint(
        schema_version=1, step=1, status=pb.STATUS_RUNNING, goal=f"goal {seed}", current_step_id="read"
    )
    first.model.model_id = "m"
    first.model.temperature = 0.5
    first.plan["read"].CopyFrom(pb.PlanStep(id="read", title="read the code", status=pb.STEP_STATUS_IN_PROGRESS))
    first.working_memory["seed"] = str(seed)
    first.messages.add(role=pb.ROLE_USER, content=f"please fix bug {seed} ✓")
    patches.append(first)
    second = pb.Checkpoint(step=2, status=pb.STATUS_WAITING_FOR_APPROVAL)
    second.working_memory["seed"] = f"{seed}-changed"
    second.messages.add(role=pb.ROLE_ASSISTANT, content="found it", name="agent")
    patches.append(second)
    third = pb.Checkpoint(step=3, status=pb.STATUS_RUNNING, current_step_id="fix")
    third.plan["read"].CopyFrom(pb.PlanStep(id="read", title="read the code", status=pb.STEP_STATUS_DONE))
    third.decisions.add(id="d1", choice="patch it", reasoning="smallest change")
    third.messages.add(role=pb.ROLE_TOOL, content="ok", tool_call_id="c1")
    patches.append(third)
    state = pb.Checkpoint()
    steps = []
    for patch in patches:
        state.MergeFrom(patch)
        steps.append(
            Step(state=state.SerializeToString(deterministic=True), patch=patch.SerializeToString(deterministic=True))
        )
    return steps


SESSIONS = {"alpha": session_steps(1), "beta": session_steps(2)}


@pytest.fixture(params=CASES, ids=IDS)
def system(request: pytest.FixtureRequest) -> Iterator[systems.System]:
    name, mode = request.param
    s = systems.make(name, mode=mode)
    yield s
    s.close()


def write(system: systems.System, session_id: str, steps: list[Step]) -> None:
    for version, step in enumerate(steps, start=1):
        system.put(session_id, version, system.prepare(step))


def assert_all_readable(system: systems.System, sessions: dict[str, list[Step]]) -> None:
    for sid, steps in sessions.items():
        assert system.matches(system.get(sid), steps[-1]), f"{sid} latest"
        assert not system.matches(system.get(sid), steps[0]), f"{sid}: matches() told versions apart"
        for version, step in enumerate(steps, start=1):
            assert system.matches(system.get(sid, version), step), f"{sid} v{version}"


def test_versions_round_trip_hot_and_cold(system: systems.System, tmp_path: Path) -> None:
    system.open(tmp_path / "data")
    for sid, steps in SESSIONS.items():
        write(system, sid, steps)
    assert_all_readable(system, SESSIONS)
    stored = system.stored_bytes()
    assert stored is None or stored > 0
    if system.persistent:
        assert system.disk_bytes() > 0
        system.reopen()
        assert_all_readable(system, SESSIONS)
        # and writes go on after a reopen, on the same sessions
        more = session_steps(1)[:2]
        write(system, "gamma", more)
        assert system.matches(system.get("gamma"), more[-1])
    else:
        assert system.disk_bytes() == 0
    system.close()
    # The runner opens the same object again on a fresh directory.
    system.open(tmp_path / "again")
    write(system, "alpha", SESSIONS["alpha"])
    assert system.matches(system.get("alpha"), SESSIONS["alpha"][-1])
    with pytest.raises(Exception):  # noqa: B017 - each system has its own not-found error
        system.get("beta")


def test_concurrent_writers_all_read_back_their_sessions(system: systems.System, tmp_path: Path) -> None:
    system.open(tmp_path / "data")
    sessions = {f"s{i}": session_steps(i) for i in range(8)}
    values = {sid: [system.prepare(step) for step in steps] for sid, steps in sessions.items()}
    errors: list[BaseException] = []
    gate = threading.Barrier(len(sessions))

    def agent(sid: str) -> None:
        try:
            gate.wait()
            for version, value in enumerate(values[sid], start=1):
                system.put(sid, version, value)
                system.get(sid)  # reads interleaved with other threads' writes
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=agent, args=(sid,)) for sid in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert_all_readable(system, sessions)


def test_make_rejects_unknown_names_and_modes() -> None:
    with pytest.raises(ValueError, match="unknown system 'nope'"):
        systems.make("nope")
    with pytest.raises(ValueError, match="unknown mode 'patch'"):
        systems.make("ckpt-embedded", mode="patch")
    assert set(systems.SYSTEMS) == {
        "ckpt-embedded",
        "ckpt-sidecar",
        "json-sqlite",
        "pbzstd-lmdb",
        "langgraph-sqlite",
        "langgraph-lmdb",
        "langgraph-memory",
    }
    for name in systems.SYSTEMS:
        s = systems.make(name, mode="replace")
        assert s.name == name and s.label


def test_prepare_hands_each_system_the_value_its_application_holds() -> None:
    steps = SESSIONS["alpha"]
    assert systems.make("ckpt-embedded").prepare(steps[1]) == steps[1].patch
    assert systems.make("ckpt-embedded", mode="replace").prepare(steps[1]) == steps[1].state
    as_dict = systems.state_to_dict(steps[1].state)
    assert as_dict["step"] == "2" and as_dict["working_memory"] == {"seed": "1-changed"}
    assert systems.make("json-sqlite").prepare(steps[1]) == as_dict
    update = systems.make("langgraph-sqlite").prepare(steps[1])
    assert isinstance(update, systems.ChannelUpdate)
    assert update.channel_values == as_dict
    assert update.updated == ("messages", "status", "step", "working_memory")


def test_checkpoint_ids_sort_by_version() -> None:
    ids = [checkpoint_id(v) for v in (0, 1, 2, 9, 10, 4095, 4096, 16384, 10**6)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(len(i) == 36 and i[14] == "6" for i in ids)  # UUIDv6-shaped, like LangGraph's


def test_sqlite_systems_report_their_durability(tmp_path: Path) -> None:
    for name in ("json-sqlite", "langgraph-sqlite"):
        s = systems.make(name)
        s.open(tmp_path / name)
        try:
            assert s.durability.startswith("journal_mode=wal, synchronous=")
        finally:
            s.close()


def test_lmdb_map_grows_when_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(systems.PbZstdLmdb, "_INITIAL_MAP_BYTES", 64 * 1024)
    s = systems.PbZstdLmdb()
    s.open(tmp_path)
    try:
        rng = random.Random(0)
        blobs = [rng.randbytes(16 * 1024) for _ in range(20)]  # incompressible: 320 KB > 64 KiB
        for version, blob in enumerate(blobs, start=1):
            s.put("big", version, blob)
        assert s._map_size > 64 * 1024
        s.reopen()
        assert s.get("big") == blobs[-1]
        assert all(s.get("big", v) == blob for v, blob in enumerate(blobs, start=1))
    finally:
        s.close()


def test_sidecar_cpu_is_counted_across_restarts(tmp_path: Path) -> None:
    s = systems.make("ckpt-sidecar")
    s.open(tmp_path)
    try:
        write(s, "alpha", SESSIONS["alpha"])
        before = s.server_cpu_seconds()
        assert before > 0
        s.reopen()
        assert s.server_cpu_seconds() >= before
    finally:
        s.close()
    assert s.server_cpu_seconds() >= before


def _own_cpu(pids: list[int]) -> float:
    return sum(proc_cpu_seconds(pid) or 0.0 for pid in pids)


def test_sidecar_cpu_counts_its_store_process_while_it_runs_and_after_it_stops(tmp_path: Path) -> None:
    s = systems.make("ckpt-sidecar")
    s.open(tmp_path)
    try:
        pids = process_and_children(s._sidecar.pid)  # type: ignore[attr-defined]
        assert len(pids) == 2, "a gRPC process and its store process"
        before = s.server_cpu_seconds()
        own_before = _own_cpu(pids)
        store_before = proc_cpu_seconds(pids[1]) or 0.0
        big = pb.Checkpoint(goal="x" * 200_000).SerializeToString()
        for i in range(150):  # merges: the store process does most of the work
            s.put(f"s{i}", 1, big)
        own_used = _own_cpu(pids) - own_before
        assert (proc_cpu_seconds(pids[1]) or 0.0) - store_before > 0.05, "the store process did work"
        counted = s.server_cpu_seconds() - before
        # Both processes were read between the harness's two readings: their CPU is all in its delta (the
        # two sums add the same clock ticks in another order: float rounding may differ in the last bit).
        assert counted >= own_used - 1e-9 and own_used > 0
        while_running = _own_cpu(pids)
        s.reopen()  # stops the sidecar: its CPU (the store process's included) is banked
        assert s.server_cpu_seconds() >= while_running - 1e-9
    finally:
        s.close()


def _open_fds() -> set[str]:
    """What this process has open: files (a database, its WAL) and sockets (a connection)."""
    fds = Path("/proc/self/fd")
    out = set()
    for fd in os.listdir(fds):
        with contextlib.suppress(OSError):  # the listing's own fd, closed since
            out.add(os.readlink(fds / fd))
    return out


PERSISTENT = [pytest.param(*case, id=i) for case, i in zip(CASES, IDS, strict=True) if case[0] != "langgraph-memory"]


@pytest.mark.parametrize(("name", "mode"), PERSISTENT)
def test_a_reopened_system_reads_without_opening_anything(name: str, mode: str, tmp_path: Path) -> None:
    # The runner times the first read after reopen as a cold read: it must not open a connection or file.
    s = systems.make(name, mode=mode)
    s.open(tmp_path / "data")
    try:
        write(s, "alpha", SESSIONS["alpha"])
        s.reopen()
        before = _open_fds()
        assert s.matches(s.get("alpha"), SESSIONS["alpha"][-1])
        assert _open_fds() - before == set()
    finally:
        s.close()
