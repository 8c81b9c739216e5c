"""What the store's tests share: states to write, and the few private hooks some behaviours need.

Every private hook of the store's tests is here, each saying why no public
way reaches the behaviour it serves.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

import lmdb
import pytest

from ckpt.bench import synthetic
from ckpt.codec import ChainEncoder, ChainPolicy, EncodedFrame, FrameKind
from ckpt.sidecar import PutRequest, PutResult, Store, StoreConfig
from ckpt.sidecar.store.ops import Op
from ckpt.v1 import checkpoint_pb2 as pb

# Small test states would always be FULL frames under the default per-frame
# cost; these tests want real chains.
CHAINS = ChainPolicy(frame_cost_bytes=0, max_depth=8)


def state_of(session: str, version: int, size: int = 600) -> bytes:
    """A deterministic state per (session, version): a growing agent log."""
    cp = pb.Checkpoint(schema_version=1, step=version, goal=f"goal of {session}")
    for i in range(1, version + 1):
        cp.messages.add(role=pb.ROLE_ASSISTANT, content=f"{session} step {i} " + "x" * (size // 10))
    return cp.SerializeToString(deterministic=True)


def patch_of(version: int) -> bytes:
    return pb.Checkpoint(
        step=version, messages=[pb.Message(content=f"merged step {version} " + "y" * 50)]
    ).SerializeToString()


def _body(session: str, size: int = 3000) -> str:
    rnd = random.Random(session)
    return "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(size))


def replace_state(session: str, version: int) -> bytes:
    """A whole state: a fixed ~3 KB body (so REPLACE writes become DELTA frames) plus a step."""
    return pb.Checkpoint(
        step=version, goal=_body(session), messages=[pb.Message(content=f"{session} replaced at {version}")]
    ).SerializeToString()


def merge_patch(session: str, version: int) -> bytes:
    return pb.Checkpoint(step=version, messages=[pb.Message(content=f"{session} patch {version}")]).SerializeToString()


def kinds(store: Store, session: str) -> list[FrameKind]:
    """The kind of each stored version's frame, oldest first."""
    return [v.frame_kind for v in reversed(store.list_versions(session)[0])]


def every_version(store: Store, session: str) -> list[bytes]:
    """Every version's state, read from storage (not the state cache), oldest first."""
    head = store.session(session).head_version
    return [store.get(session, v, use_cache=False).state for v in range(1, head + 1)]


def layout_stamp(data: Path) -> bytes | None:
    """The layout version stored in the data directory ``data`` (None without a meta table or key)."""
    env = lmdb.open(str(data / "lmdb"), max_dbs=8, readonly=True)
    try:
        try:
            meta = env.open_db(b"meta", create=False)
        except lmdb.NotFoundError:
            return None
        with env.begin(db=meta) as txn:
            raw = txn.get(b"layout_version")
            return None if raw is None else bytes(raw)
    finally:
        env.close()


#: A sweep this far after the writes finds them quiet enough to fold (fold_after_quiet_seconds: 60 s by default).
LATER = 120 * 10**9


def merge_patches(seed: int, steps: int = 40) -> list[bytes]:
    """A MERGE session's patches, ``steps`` of them (synthetic agent steps): folded runs to write."""
    return [s.patch for s in synthetic.session(seed, steps=steps, memory_keys=12, plan_steps=8)]


def history_states(store: Store, session: str, page_size: int = 7) -> list[bytes]:
    """Every state by pages of history with states (a page's PREFIX versions read from its own newer ones)."""
    states: list[bytes] = []
    token = ""
    while True:
        page, token = store.list_versions(session, include_states=True, page_size=page_size, page_token=token)
        states += [got.state for got in page]
        if not token:
            return states[::-1]


def merged(patches: list[bytes]) -> list[bytes]:
    """The state after each of ``patches`` (each appended to the state before)."""
    return [b"".join(patches[: i + 1]) for i in range(len(patches))]


@contextlib.contextmanager
def frames_table(data: Path) -> Iterator[tuple[lmdb.Transaction, lmdb._Database]]:
    """The frames table of a closed store, to damage (committed at the end of the block): no public way
    writes damage."""
    env = lmdb.open(str(data / "lmdb"), max_dbs=12)
    try:
        with env.begin(write=True) as txn:
            yield txn, env.open_db(b"frames", txn=txn)
    finally:
        env.close()


def long_chains(config: StoreConfig) -> StoreConfig:
    """``config`` writing no FULL frame within 200 patches, so that the run folded is the whole session."""
    return replace(config, chain_policy=ChainPolicy(max_depth=200, max_decode_cost_ratio=1000.0))


def put_request(store: Store, request: PutRequest) -> PutResult:
    """``store.put`` of a PutRequest's fields."""
    return store.put(
        request.session_id,
        request.state,
        mode=request.mode,
        expected_version=request.expected_version,
        request_id=request.request_id,
        labels=request.labels,
        message_type=request.message_type,
        expected_state_xxh3=request.expected_state_xxh3,
    )


def put_later(store: Store, request: PutRequest) -> Future[PutResult]:
    """``store.put`` of ``request`` on a thread of its own, its outcome in the returned future."""
    future: Future[PutResult] = Future()

    def run() -> None:
        try:
            future.set_result(put_request(store, request))
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=run, daemon=True).start()
    return future


# -- private hooks ---------------------------------------------------------------------
#
# The writer's batches are made of whatever is queued when it looks: to make
# several writes share one commit (or not), a test holds the writer inside an
# op of its own, queues what it wants, and lets go. No public call makes the
# writer wait in the middle of a batch, and no public number says how many
# writes are queued behind it (queued_write_bytes counts bytes, and forks and
# deletes have none).


def submit_op(store: Store, op: Op) -> Op:
    """Queue an op of the test's own for the writer (see above)."""
    return store._writer.submit(op)


def hold_writer(store: Store, *, then_seconds: float = 0.0) -> threading.Event:
    """Block the writer in an op of the test's own until the returned gate is set (then sleep ``then_seconds``)."""
    running, gate = threading.Event(), threading.Event()

    def hold(batch: object, txn: object) -> None:
        running.set()
        gate.wait(30)
        time.sleep(then_seconds)

    submit_op(store, Op(hold, fails_clean=True))
    assert running.wait(10)
    return gate


@contextlib.contextmanager
def writer_held(store: Store) -> Iterator[threading.Event]:
    """The store's writer blocked in an op of the test's own until the block ends (or the event is set)."""
    gate = hold_writer(store)
    try:
        yield gate
    finally:
        gate.set()


def sleeping_op(seconds: float) -> Op:
    """An op that makes its batch's commit take ``seconds`` (which bounds the next commit's delay)."""

    def apply(batch: object, txn: object) -> None:
        time.sleep(seconds)

    return Op(apply, fails_clean=True)


@contextlib.contextmanager
def committing_threads(store: Store) -> Iterator[list[str]]:
    """The names of the threads that commit the store's writes while the block runs, one per commit."""
    storage = store._storage
    committed = storage.committed
    names: list[str] = []

    def recording() -> None:
        names.append(threading.current_thread().name)
        committed()

    storage.committed = recording  # type: ignore[method-assign]
    try:
        yield names
    finally:
        del storage.committed  # the class's method again


def queued_ops(store: Store) -> int:
    """Ops queued for the writer and not yet taken into a batch (see above)."""
    return store._writer.queue.qsize()


def wait_queued(store: Store, n: int) -> None:
    """Wait until at least ``n`` ops are queued for the writer."""
    deadline = time.monotonic() + 10
    while queued_ops(store) < n:
        assert time.monotonic() < deadline, f"{queued_ops(store)} of {n} ops queued"
        time.sleep(0.001)


def room_waiters(store: Store) -> int:
    """Writers waiting for room under max_queued_write_bytes (no public number says how many wait)."""
    return store._writer.room_waiters


@contextlib.contextmanager
def storage_write_lock_held(store: Store) -> Iterator[None]:
    """Hold the storage's write lock in this thread, as another process writing the same data would.

    In this process the store's own storage is the only handle to it (LMDB allows
    one environment per file and process); a sidecar test takes it from outside.
    """
    with store._storage.write():
        yield


def storage_of(store: Store) -> Any:
    """The store's storage (sidecar/storage), for tests of what only the LMDB implementation does."""
    return store._storage


class EncodingGate:
    """Once armed, blocks the first frame encoded of a large state (a REPLACE of ``large_bytes`` or more;
    with ``merges``, any MERGE) until let go, noting its thread; and notes what encoded every frame of a
    large state (a MERGE: making one), and on which thread."""

    def __init__(self, large_bytes: int, *, merges: bool = False) -> None:
        self.large_bytes = large_bytes
        self.merges = merges
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()
        self.thread: threading.Thread | None = None
        self.large: list[tuple[str, str]] = []  # (replace or merge, the thread's name)

    def _gate(self, large: str) -> None:
        if large:
            self.large.append((large, threading.current_thread().name))
        if self.armed and not self.entered.is_set():
            self.thread = threading.current_thread()
            self.entered.set()
            self.release.wait(30)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        replace, merge = ChainEncoder.replace, ChainEncoder.merge

        def gated_replace(encoder: ChainEncoder, state: Any) -> EncodedFrame:
            if len(state) >= self.large_bytes:
                self._gate("replace")
            return replace(encoder, state)

        def gated_merge(
            encoder: ChainEncoder, state: Any, *, checked: bool = False, max_state_size: int | None = None
        ) -> EncodedFrame:
            self._gate("merge" if encoder.state_size + len(state) >= self.large_bytes else "")
            return merge(encoder, state, checked=checked, max_state_size=max_state_size)

        monkeypatch.setattr(ChainEncoder, "replace", gated_replace)
        if self.merges:
            monkeypatch.setattr(ChainEncoder, "merge", gated_merge)


@contextlib.contextmanager
def gate_installed(
    monkeypatch: pytest.MonkeyPatch, large_bytes: int, *, merges: bool = False
) -> Iterator[EncodingGate]:
    """An :class:`EncodingGate` installed for a test; let go at its end, so no encoding waits out its timeout."""
    gate = EncodingGate(large_bytes, merges=merges)
    gate.install(monkeypatch)
    try:
        yield gate
    finally:
        gate.release.set()
