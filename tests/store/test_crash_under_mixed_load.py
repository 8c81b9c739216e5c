"""A sidecar killed with SIGKILL under mixed load (unary writes, streams, forks, deletes, retention)
restarts with every acknowledged write, fork and delete, and answers the writes in flight exactly once."""

from __future__ import annotations

import random
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ckpt.sidecar.client import (
    CheckpointClient,
    CheckpointError,
    NotFoundError,
)
from ckpt.v1 import service_pb2
from tests.store.support import merge_patch, replace_state
from tests.support import ckpt, start_sidecar, start_sidecar_sweeping


def stream_state(session: str, version: int) -> bytes:
    """Stream sessions only ever MERGE ``merge_patch(session, v)`` as version v."""
    return b"".join(merge_patch(session, v) for v in range(1, version + 1))


@dataclass
class Model:
    """What clients were told (acknowledged) and what was in flight when the sidecar died."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    #: unary sessions: every version's state, as written (acknowledged or resolved after restart)
    states: dict[str, dict[int, bytes]] = field(default_factory=dict)
    #: unary writes in flight at the kill: (session, version, request id, mode, payload)
    pending_writes: list[tuple[str, int, str, int, bytes]] = field(default_factory=list)
    #: stream sessions: highest acknowledged version
    stream_acked: dict[str, int] = field(default_factory=dict)
    #: fork target -> its version 1's state (acknowledged forks not yet deleted)
    forks: dict[str, bytes] = field(default_factory=dict)
    deleted: set[str] = field(default_factory=set)
    #: forks / deletes in flight at the kill: target -> state it would hold
    pending_forks: dict[str, bytes] = field(default_factory=dict)
    pending_deletes: dict[str, bytes] = field(default_factory=dict)
    #: unary sessions: the oldest version kept at the last check
    first: dict[str, int] = field(default_factory=dict)
    #: acknowledged unary writes, forks and deletes; and stream writes
    acks: int = 0
    stream_acks: int = 0
    errors: list[str] = field(default_factory=list)

    def head(self, session: str) -> int:
        return max(self.states.get(session, {}), default=0)


UNARY = [f"u{n}" for n in range(3)]
STREAMS = {n: [f"p{n}_{k}" for k in range(3)] for n in range(2)}


def _unary_writer(target: str, session: str, model: Model, stop: threading.Event) -> None:
    with CheckpointClient(target, retries=0) as c:
        while not stop.is_set():
            with model.lock:
                head = model.head(session)
                base = model.states.get(session, {}).get(head, b"")
            v = head + 1
            merge = v % 3 != 1  # REPLACE, MERGE, MERGE, REPLACE, ...
            payload = merge_patch(session, v) if merge else replace_state(session, v)
            expected = base + payload if merge else payload
            rid = f"{session}:{v}"
            write = c.merge if merge else c.put
            try:
                r = write(session, payload, expected_version=head, request_id=rid)
            except CheckpointError as exc:
                with model.lock:
                    if exc.code.name != "UNAVAILABLE":
                        model.errors.append(f"{session} v{v}: {exc.code.name} {exc}")
                    mode = service_pb2.WRITE_MODE_MERGE if merge else service_pb2.WRITE_MODE_REPLACE
                    model.pending_writes.append((session, v, rid, mode, payload))
                    model.states.setdefault(session, {})  # the pending write's base is states[session][head]
                return
            with model.lock:
                if r.version != v:
                    model.errors.append(f"{session}: acknowledged version {r.version}, expected {v}")
                model.states.setdefault(session, {})[v] = expected
                model.acks += 1


def _stream_writer(target: str, n: int, model: Model, stop: threading.Event) -> None:
    sessions = STREAMS[n]
    with model.lock:
        heads = {s: model.stream_acked.get(s, 0) for s in sessions}
    sent: list[tuple[str, int]] = []

    def puts() -> Iterator[service_pb2.PutRequest]:
        i = 0
        while not stop.is_set():
            s = sessions[i % len(sessions)]
            i += 1
            if i % 8 == 0:
                stop.wait(0.002)  # leave the unary writers (same process, same GIL) their share
            v = heads[s] + 1
            heads[s] = v
            sent.append((s, v))
            yield service_pb2.PutRequest(
                session_id=s,
                state=merge_patch(s, v),
                mode=service_pb2.WRITE_MODE_MERGE,
                expected_version=v - 1,
                request_id=f"{s}:{v}",
            )

    with CheckpointClient(target, retries=0) as c:
        try:
            for k, result in enumerate(c.put_stream(puts(), batch_size=8)):
                s, v = sent[k]
                with model.lock:
                    if result.WhichOneof("outcome") != "response" or result.response.version != v:
                        model.errors.append(f"stream {s} v{v}: {result}")
                        return
                    model.stream_acked[s] = v
                    model.stream_acks += 1
        except CheckpointError as exc:
            if exc.code.name != "UNAVAILABLE":
                with model.lock:
                    model.errors.append(f"stream {n}: {exc.code.name} {exc}")


def _fork_deleter(target: str, run: int, model: Model, stop: threading.Event) -> None:
    rnd = random.Random(run)
    with CheckpointClient(target, retries=0) as c:
        i = 0
        while not stop.is_set():
            i += 1
            with model.lock:
                live = sorted(model.forks)
                source = rnd.choice(UNARY)
                version = model.head(source)
                state = model.states.get(source, {}).get(version)
            if i % 3 == 0 and live:
                victim = live[0]
                try:
                    c.delete(victim)
                except CheckpointError as exc:
                    with model.lock:
                        if exc.code.name == "UNAVAILABLE":
                            model.pending_deletes[victim] = model.forks.pop(victim)
                        else:
                            model.errors.append(f"delete {victim}: {exc.code.name} {exc}")
                    return
                with model.lock:
                    model.deleted.add(victim)
                    del model.forks[victim]
                    model.acks += 1
                continue
            if state is None:
                stop.wait(0.005)
                continue
            new = f"f{run}_{i}"
            try:
                c.fork(source, new, version=version)
            except NotFoundError:
                continue  # retention removed that version meanwhile: nothing was written
            except CheckpointError as exc:
                with model.lock:
                    if exc.code.name == "UNAVAILABLE":
                        model.pending_forks[new] = state
                    else:
                        model.errors.append(f"fork {source}@{version}: {exc.code.name} {exc}")
                return
            with model.lock:
                model.forks[new] = state
                model.acks += 1


def _resolve_and_check(c: CheckpointClient, model: Model, keep_last: int | None) -> None:
    """On the restarted sidecar: settle what was in flight, then compare everything with the model."""
    # Writes in flight: committed whole or not at all. A retry with the same request id tells which.
    for session, v, rid, mode, payload in model.pending_writes:
        head = _head_or_zero(c, session)
        assert head in (v - 1, v), f"{session}: head {head} after a kill with version {v} in flight"
        write = c.merge if mode == service_pb2.WRITE_MODE_MERGE else c.put
        r = write(session, payload, expected_version=v - 1, request_id=rid)
        assert (r.version, r.replayed) == (v, head == v), f"{session} v{v}: {r}"
        base = model.states[session].get(v - 1, b"")
        model.states[session][v] = base + payload if mode == service_pb2.WRITE_MODE_MERGE else payload
    model.pending_writes.clear()

    for fork, state in list(model.pending_forks.items()):
        try:
            got = c.get(fork)
        except NotFoundError:
            continue
        assert (got.version, got.state) == (1, state), f"fork {fork} in flight is not whole"
        model.forks[fork] = state
    model.pending_forks.clear()
    for victim, state in list(model.pending_deletes.items()):
        try:
            got = c.get(victim)
        except NotFoundError:
            model.deleted.add(victim)
            continue
        assert (got.version, got.state) == (1, state), f"{victim}: a delete in flight left it half-deleted"
        model.forks[victim] = state
    model.pending_deletes.clear()

    listed = {s.session_id: s for s in c.sessions()}
    for session, states in model.states.items():
        if not states:
            continue
        head = max(states)
        info = listed[session]
        assert info.head_version == head, f"{session}: listed head {info.head_version}, acknowledged {head}"
        history = list(c.history(session))
        versions = [h.version for h in history]
        first = versions[-1]
        assert versions == list(range(head, first - 1, -1)), f"{session}: history {versions}"
        assert info.version_count == len(versions)
        if keep_last is not None:  # keeps at least the newest N (earlier runs may have pruned by age)
            kept_before = model.first.get(session, 1)
            assert first <= max(kept_before, head - keep_last + 1), f"{session}: retention kept only {first}..{head}"
        model.first[session] = first
        for h in history:
            assert h.state_size == len(states[h.version]), f"{session} v{h.version}"
            assert c.get(session, h.version).state == states[h.version], f"{session} v{h.version}"
        if first > 1:
            with pytest.raises(NotFoundError, match="removed by retention"):
                c.get(session, first - 1)
    for session, acked in model.stream_acked.items():
        head = listed[session].head_version
        assert head >= acked, f"{session}: acknowledged {acked}, head {head}"
        for h in c.history(session):
            assert c.get(session, h.version).state == stream_state(session, h.version), f"{session} v{h.version}"
        model.stream_acked[session] = head  # committed, unacknowledged stream writes were whole: keep them
    for fork, state in model.forks.items():
        assert fork in listed, f"acknowledged fork {fork} is not listed"
        got = c.get(fork)
        assert (got.version, got.state) == (1, state), fork
    for victim in model.deleted:
        assert victim not in listed, f"deleted {victim} is listed"
        with pytest.raises(NotFoundError):
            c.get(victim)


def _head_or_zero(c: CheckpointClient, session: str) -> int:
    try:
        return int(c.get(session).version)
    except NotFoundError:
        return 0


# (unary writes, forks and deletes acknowledged before the kill, retention flags):
# kill points spread from "just started" to "busy".
KILL_POINTS = [
    (1, ("--keep-last-versions", "4")),
    (25, ("--keep-last-versions", "4")),
    (60, ("--keep-last-versions", "6", "--max-version-age-seconds", "0.3")),
    (10, ("--max-version-age-seconds", "0.2")),
    (100, ("--keep-last-versions", "3")),
    (3, ("--keep-last-versions", "2", "--max-version-age-seconds", "0.1")),
    (40, ("--keep-last-versions", "5")),
]


def test_sigkill_under_mixed_load_keeps_every_acknowledged_write_fork_and_delete(tmp_path: Path) -> None:
    data = tmp_path / "data"
    model = Model()
    for run, (kill_after, retention) in enumerate(KILL_POINTS):
        sidecar = start_sidecar_sweeping(data, 0.02, *retention)
        stop = threading.Event()
        threads = [threading.Thread(target=_unary_writer, args=(sidecar.unix_target, s, model, stop)) for s in UNARY]
        threads += [
            threading.Thread(target=_stream_writer, args=(sidecar.unix_target, n, model, stop)) for n in STREAMS
        ]
        threads.append(threading.Thread(target=_fork_deleter, args=(sidecar.unix_target, run, model, stop)))
        start_acks = model.acks
        for t in threads:
            t.start()
        while model.acks - start_acks < kill_after and all(t.is_alive() for t in threads):
            stop.wait(0.002)
        assert sidecar.stop(signal.SIGKILL) == -signal.SIGKILL
        stop.set()
        for t in threads:
            t.join(30)
        assert not model.errors, model.errors
        # The load reached the kill point (a few more may be acknowledged between the count and the kill).
        assert model.acks - start_acks >= kill_after, f"run {run}: {model.acks - start_acks} acks"
        # Offline, before anything reopens it: the directory as the kill left it.
        verify = ckpt("verify", "--data-dir", str(data))
        assert verify.returncode == 0, verify.stderr.decode()
        assert b" 0 failed" in verify.stdout and b"Traceback" not in verify.stderr
        keep_last = int(retention[1]) if retention[0] == "--keep-last-versions" and len(retention) == 2 else None
        checker = start_sidecar(data)  # no retention: nothing moves while we look
        try:
            with CheckpointClient(checker.unix_target) as c:
                _resolve_and_check(c, model, keep_last)
        finally:
            assert checker.stop() == 0, checker.log(tail_chars=3000)
    assert model.deleted and model.forks  # the load did fork and delete
