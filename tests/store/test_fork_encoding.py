"""A fork reads and encodes its source's state on its caller's thread, and commits what the source holds then."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from ckpt.sidecar import NotFound, PutRequest, SessionInfo, Store, StoreConfig
from ckpt.v1 import checkpoint_pb2 as pb
from tests.store.support import EncodingGate, gate_installed, put_later

#: States at least this large are a fork's the gate blocks; the other writes here are smaller.
LARGE = 100_000


def large_state(seed: int) -> bytes:
    return random.Random(seed).randbytes(LARGE + seed)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(StoreConfig(data_dir=tmp_path / "data")) as s:
        yield s


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[EncodingGate]:
    with gate_installed(monkeypatch, LARGE) as g:
        yield g


def fork_later(
    store: Store, version: int, gate: EncodingGate, *, forking: Callable[[threading.Thread], None] = lambda t: None
) -> Future[SessionInfo]:
    """``store.fork("src", version, "copy")`` on a thread of its own (passed to ``forking``), ``gate`` armed
    first; its outcome in the returned future."""
    future: Future[SessionInfo] = Future()

    def run() -> None:
        try:
            future.set_result(store.fork("src", version, "copy"))
        except BaseException as exc:
            future.set_exception(exc)

    thread = threading.Thread(target=run, daemon=True)
    forking(thread)
    gate.armed = True
    thread.start()
    return future


def test_another_sessions_write_commits_while_a_fork_encodes_its_state_on_its_own_thread(
    store: Store, gate: EncodingGate
) -> None:
    source = large_state(1)
    store.put("src", source)
    threads: list[threading.Thread] = []
    forked = fork_later(store, 0, gate, forking=threads.append)
    assert gate.entered.wait(30)
    # The fork's encoding is blocked: the writer is not in it, so another session's put commits meanwhile.
    other = put_later(store, PutRequest("other", b"small"))
    try:
        assert other.result(timeout=30).version == 1
    finally:
        gate.release.set()
    assert gate.thread is threads[0]  # encoded by the fork's caller, not by the writer
    info = forked.result(timeout=30)
    assert (info.head_version, info.forked_from_session_id, info.forked_from_version) == (1, "src", 1)
    assert store.get("copy").state == source


def test_a_fork_of_the_latest_forks_the_head_at_its_commit_after_a_write_during_its_encoding(
    store: Store, gate: EncodingGate
) -> None:
    store.put("src", large_state(1))
    forked = fork_later(store, 0, gate)
    assert gate.entered.wait(30)
    newer = large_state(2)
    store.put("src", newer)
    gate.release.set()
    assert forked.result(timeout=30).forked_from_version == 2
    assert store.get("copy").state == newer
    assert store.get("copy").info.state_xxh3 == store.get("src").info.state_xxh3


def test_a_fork_of_a_session_deleted_and_written_again_during_its_encoding_forks_the_new_one(
    store: Store, gate: EncodingGate
) -> None:
    store.put("src", large_state(1))
    forked = fork_later(store, 1, gate)
    assert gate.entered.wait(30)
    store.delete_session("src")
    again = large_state(2)
    store.put("src", again)
    gate.release.set()
    assert forked.result(timeout=30).forked_from_version == 1
    assert store.get("copy").state == again


@pytest.mark.parametrize(
    ("written_again", "error"),
    [(0, "session 'src' does not exist"), (1, "session 'src' has no version 2; the head is version 1")],
)
def test_a_fork_of_a_version_removed_during_its_encoding_is_not_found(
    store: Store, gate: EncodingGate, written_again: int, error: str
) -> None:
    store.put("src", b"first")
    store.put("src", large_state(1))
    forked = fork_later(store, 2, gate)
    assert gate.entered.wait(30)
    store.delete_session("src")
    for _ in range(written_again):
        store.put("src", b"again")
    gate.release.set()
    with pytest.raises(NotFound, match=error):
        forked.result(timeout=30)
    assert [s.session_id for s in store.list_sessions()[0]] == ["src"] * written_again


def test_a_fork_takes_the_type_its_source_took_during_its_encoding(store: Store, gate: EncodingGate) -> None:
    early = pb.Checkpoint(goal="g" * LARGE).SerializeToString()  # untyped, but parses as the type
    store.put("src", early)
    forked = fork_later(store, 1, gate)
    assert gate.entered.wait(30)
    store.put("src", pb.Checkpoint(goal="typed").SerializeToString(), message_type="ckpt.v1.Checkpoint")
    gate.release.set()
    # As a fork of the typed session: its every state parses as the type, so version 1 carries it.
    assert forked.result(timeout=30).message_type == "ckpt.v1.Checkpoint"
    got = store.get("copy")
    assert (got.state, got.info.message_type) == (early, "ckpt.v1.Checkpoint")
