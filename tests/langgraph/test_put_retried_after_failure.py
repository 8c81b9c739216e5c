"""Writes saved before their checkpoint's put (as LangGraph does) come with that checkpoint when its put
failed once (the sidecar down) and is made again: the saver keeps where those writes are until a put of
the checkpoint succeeds. Python and LangGraph.js savers, on a real sidecar stopped and started again."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6

from ckpt.sidecar.client import UnavailableError
from ckpt.sidecar.langgraph import CheckpointConflictError, CkptSaver
from tests.langgraph.test_node_saver import node_process
from tests.langgraph.test_node_saver_records import run_node
from tests.support import Sidecar, start_sidecar


def _thread(checkpoint_id: str | None = None) -> Any:
    configurable = {"thread_id": "t", "checkpoint_ns": ""}
    if checkpoint_id:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


@contextlib.contextmanager
def _saver(tmp_path: Path, on: str) -> Iterator[CkptSaver]:
    """A saver on a sidecar of its own (``on`` "sidecar") or embedded, on ``tmp_path / "data"``."""
    sidecar = start_sidecar(tmp_path / "data") if on == "sidecar" else None
    try:
        with CkptSaver(sidecar.unix_target) if sidecar else CkptSaver.embedded(tmp_path / "data") as saver:
            yield saver
    finally:
        if sidecar is not None:
            assert sidecar.stop() == 0, sidecar.log()


def test_python_writes_before_a_failed_put_come_with_its_checkpoint_put_again(tmp_path: Path) -> None:
    data, sock = tmp_path / "data", tmp_path / "ckpt.sock"
    sidecar = start_sidecar(data, socket_path=sock)
    checkpoint: Any = empty_checkpoint()
    checkpoint.update(id=str(uuid6(clock_seq=-1)), channel_values={"x": 1}, channel_versions={"x": 1})
    metadata: Any = {"source": "loop", "step": -1, "parents": {}}
    try:
        with CkptSaver(sidecar.unix_target) as saver:
            assert saver.get_tuple(_thread()) is None  # a run begins by reading the thread
            saver.put_writes(_thread(checkpoint["id"]), [("__interrupt__", "approve?")], "task-1")
            assert sidecar.stop() == 0, sidecar.log()
            with pytest.raises(UnavailableError):
                saver.put(_thread(), checkpoint, metadata, {"x": 1})
            sidecar = start_sidecar(data, socket_path=sock)
            assert saver.put(_thread(), checkpoint, metadata, {"x": 1}) == _thread(checkpoint["id"])
        with CkptSaver(sidecar.unix_target) as fresh:
            read = fresh.get_tuple(_thread())
            assert read is not None and read.config == _thread(checkpoint["id"])
            assert read.pending_writes == [("task-1", "__interrupt__", "approve?")]
    finally:
        assert sidecar.stop() == 0, sidecar.log()


# The same from LangGraph.js; the test stops and starts the sidecar when the script says where it is.
_JS = r"""
const readline = require('readline');
const { emptyCheckpoint, uuid6 } = require(process.argv[1] + '/node_modules/@langchain/langgraph-checkpoint');
const { CkptSaver } = require(process.argv[1] + '/langgraph.js');
const lines = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const thread = (id) => ({ configurable: { thread_id: 't', checkpoint_ns: '', ...(id ? { checkpoint_id: id } : {}) } });
(async () => {
  const saver = new CkptSaver(process.argv[2]);
  const checkpoint = { ...emptyCheckpoint(), id: uuid6(-1), channel_values: { x: 1 }, channel_versions: { x: 1 } };
  const metadata = { source: 'loop', step: -1, parents: {} };
  await saver.getTuple(thread());
  await saver.putWrites(thread(checkpoint.id), [['__interrupt__', 'approve?']], 'task-1');
  console.log('wrote');
  await lines.next();  // the sidecar is stopped
  const failed = await saver.put(thread(), checkpoint, metadata, { x: 1 }).then(() => 'put', (err) => err.code);
  console.log(failed);
  await lines.next();  // the sidecar is started again
  await saver.put(thread(), checkpoint, metadata, { x: 1 });
  const fresh = new CkptSaver(process.argv[2]);
  const read = await fresh.getTuple(thread());
  console.log(JSON.stringify({ id: read.checkpoint.id === checkpoint.id, pending: read.pendingWrites }));
  saver.close();
  fresh.close();
  process.exit(0);
})().catch((err) => { console.error(err); process.exit(1); });
"""


def test_js_writes_before_a_failed_put_come_with_its_checkpoint_put_again(tmp_path: Path) -> None:
    data, sock = tmp_path / "data", tmp_path / "ckpt.sock"
    sidecar = start_sidecar(data, socket_path=sock)
    node = node_process(_JS, sidecar.unix_target)
    assert node.stdin is not None and node.stdout is not None
    try:
        assert node.stdout.readline() == "wrote\n"
        assert sidecar.stop() == 0, sidecar.log()
        node.stdin.write("stopped\n")
        node.stdin.flush()
        assert node.stdout.readline() == "14\n"  # UNAVAILABLE
        sidecar = start_sidecar(data, socket_path=sock)
        node.stdin.write("started\n")
        node.stdin.flush()
        out, err = node.communicate(timeout=60)
        assert node.returncode == 0, err
        assert json.loads(out) == {"id": True, "pending": [["task-1", "__interrupt__", "approve?"]]}
    finally:
        node.kill()
        assert sidecar.stop() == 0, sidecar.log()


def _checkpoint(checkpoint_id: str, x: str) -> Any:
    checkpoint: Any = empty_checkpoint()
    checkpoint.update(id=checkpoint_id, channel_values={"x": x}, channel_versions={"x": x})
    return checkpoint


@pytest.mark.parametrize("on", ["embedded", "sidecar"])
def test_a_checkpoint_put_again_keeps_its_writes_and_an_earlier_one_is_refused(tmp_path: Path, on: str) -> None:
    """The latest checkpoint put again (a put retried once it landed) is written again with its pending
    writes, as InMemorySaver overwrites it; an earlier one put again is refused naming it, rather than
    written as the thread's latest."""
    with _saver(tmp_path, on) as saver:
        first = saver.put(_thread(), _checkpoint("1", "a"), {"step": 0}, {"x": "a"})
        saver.put_writes(first, [("x", "pending")], "task-1")
        assert saver.put(_thread(), _checkpoint("1", "a"), {"step": 0}, {"x": "a"}) == first
        read = saver.get_tuple(first)
        assert read is not None and read.pending_writes == [("task-1", "x", "pending")]
        second = saver.put(first, _checkpoint("2", "b"), {"step": 1}, {"x": "b"})
        with pytest.raises(ValueError, match=r"checkpoint '1' of thread 't' .* is stored already, and is not"):
            saver.put(_thread(), _checkpoint("1", "a"), {"step": 0}, {"x": "a"})
        latest = saver.get_tuple(_thread())
        assert latest is not None and latest.config == second
        assert [t.checkpoint["id"] for t in saver.list(_thread())] == ["2", "1"]


_JS_AGAIN = r"""
const { emptyCheckpoint } = require(process.argv[1] + '/node_modules/@langchain/langgraph-checkpoint');
const { CkptSaver } = require(process.argv[1] + '/langgraph.js');
const thread = { configurable: { thread_id: 't', checkpoint_ns: '' } };
const checkpoint = (id, x) => ({ ...emptyCheckpoint(), id, channel_values: { x }, channel_versions: { x } });
(async () => {
  const saver = new CkptSaver(process.argv[2]);
  const out = {};
  const first = await saver.put(thread, checkpoint('1', 'a'), { step: 0 }, { x: 'a' });
  await saver.putWrites(first, [['x', 'pending']], 'task-1');
  out.again = (await saver.put(thread, checkpoint('1', 'a'), { step: 0 }, { x: 'a' })).configurable.checkpoint_id;
  out.pending = (await saver.getTuple(first)).pendingWrites;
  await saver.put(first, checkpoint('2', 'b'), { step: 1 }, { x: 'b' });
  const earlier = saver.put(thread, checkpoint('1', 'a'), { step: 0 }, { x: 'a' });
  out.earlier = await earlier.then(() => null, (e) => e.message);
  out.latest = (await saver.getTuple(thread)).checkpoint.id;
  out.listed = [];
  for await (const t of saver.list(thread)) out.listed.push(t.checkpoint.id);
  saver.close();
  console.log(JSON.stringify(out));
})().catch((err) => { console.error(err); process.exit(1); });
"""


def test_js_a_checkpoint_put_again_keeps_its_writes_and_an_earlier_one_is_refused(sidecar: Sidecar) -> None:
    out = run_node(_JS_AGAIN, sidecar)
    assert out.pop("earlier").startswith('checkpoint "1" of thread "t" (checkpoint_ns "") is stored already')
    assert out == {"again": "1", "pending": [["task-1", "x", "pending"]], "latest": "2", "listed": ["2", "1"]}


class _ReplyLost:
    """A saver's backend whose next put is stored and then fails as a reply lost would (the sidecar gone
    between storing the write and answering it, past the client's retries)."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self.lose_next_put = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def put(self, *args: Any) -> Any:
        done = self._backend.put(*args)
        if self.lose_next_put:
            self.lose_next_put = False
            raise UnavailableError("the reply was lost", grpc.StatusCode.UNAVAILABLE)
        return done


@pytest.mark.parametrize("on", ["embedded", "sidecar"])
def test_a_put_made_again_after_its_reply_was_lost_succeeds(tmp_path: Path, on: str) -> None:
    """A put stored whose reply never came, made again: it finds its own checkpoint as the head and returns,
    rather than report that another writer moved the thread; the next step goes on from it."""
    with _saver(tmp_path, on) as saver:
        backend = saver._backend = _ReplyLost(saver._backend)
        first = saver.put(_thread(), _checkpoint("1", "a"), {"step": 0}, {"x": "a"})
        saver.put_writes(_thread("2"), [("x", "early")], "task-1")  # before its checkpoint's put
        backend.lose_next_put = True
        with pytest.raises(UnavailableError):
            saver.put(first, _checkpoint("2", "b"), {"step": 1}, {"x": "b"})
        assert saver.put(first, _checkpoint("2", "b"), {"step": 1}, {"x": "b"}) == _thread("2")
        third = saver.put(_thread("2"), _checkpoint("3", "c"), {"step": 2}, {"x": "c"})
        assert [t.checkpoint["id"] for t in saver.list(_thread())] == ["3", "2", "1"]
        second = saver.get_tuple(_thread("2"))
        assert second is not None and second.pending_writes == [("task-1", "x", "early")]
        latest = saver.get_tuple(_thread())
        assert latest is not None and latest.config == third


_JS_REPLY_LOST = r"""
const { emptyCheckpoint } = require(process.argv[1] + '/node_modules/@langchain/langgraph-checkpoint');
const { CkptSaver } = require(process.argv[1] + '/langgraph.js');
const thread = (id) => ({ configurable: { thread_id: 't', checkpoint_ns: '', ...(id ? { checkpoint_id: id } : {}) } });
const checkpoint = (id, x) => ({ ...emptyCheckpoint(), id, channel_values: { x }, channel_versions: { x } });
(async () => {
  const saver = new CkptSaver(process.argv[2]);
  // The next put is stored, then fails as a reply lost would.
  const append = saver.client.appendEvents.bind(saver.client);
  let lose = false;
  saver.client.appendEvents = async (...args) => {
    const reply = await append(...args);
    if (lose && args[2] && args[2].put) {
      lose = false;
      throw Object.assign(new Error('14 UNAVAILABLE: the reply was lost'), { code: 14 });
    }
    return reply;
  };
  const out = {};
  const first = await saver.put(thread(), checkpoint('1', 'a'), { step: 0 }, { x: 'a' });
  await saver.putWrites(thread('2'), [['x', 'early']], 'task-1');
  lose = true;
  out.failed = await saver.put(first, checkpoint('2', 'b'), { step: 1 }, { x: 'b' }).then(() => null, (e) => e.code);
  out.again = (await saver.put(first, checkpoint('2', 'b'), { step: 1 }, { x: 'b' })).configurable.checkpoint_id;
  const third = await saver.put(thread('2'), checkpoint('3', 'c'), { step: 2 }, { x: 'c' });
  out.listed = [];
  for await (const t of saver.list(thread())) out.listed.push(t.checkpoint.id);
  out.pending = (await saver.getTuple(thread('2'))).pendingWrites;
  out.latest = (await saver.getTuple(thread())).checkpoint.id === third.configurable.checkpoint_id;
  saver.close();
  console.log(JSON.stringify(out));
})().catch((err) => { console.error(err); process.exit(1); });
"""


def test_js_a_put_made_again_after_its_reply_was_lost_succeeds(sidecar: Sidecar) -> None:
    assert run_node(_JS_REPLY_LOST, sidecar) == {
        "failed": 14,
        "again": "2",
        "listed": ["3", "2", "1"],
        "pending": [["task-1", "x", "early"]],
        "latest": True,
    }


def test_after_a_put_whose_reply_was_lost_another_writer_is_still_caught(sidecar: Sidecar) -> None:
    """The put made again finds its own checkpoint as the head: the saver keeps that head, so its next
    step continues it with compare-and-set and fails if another writer moved the thread meanwhile."""
    with CkptSaver(sidecar.unix_target) as saver, CkptSaver(sidecar.unix_target) as other:
        backend = saver._backend = _ReplyLost(saver._backend)
        first = saver.put(_thread(), _checkpoint("1", "a"), {"step": 0}, {"x": "a"})
        backend.lose_next_put = True
        with pytest.raises(UnavailableError):
            saver.put(first, _checkpoint("2", "b"), {"step": 1}, {"x": "b"})
        second = saver.put(first, _checkpoint("2", "b"), {"step": 1}, {"x": "b"})
        head = other.get_tuple(_thread())
        assert head is not None and head.config == second
        theirs = other.put(second, _checkpoint("3b", "other"), {"step": 2}, {"x": "other"})
        with pytest.raises(CheckpointConflictError):
            saver.put(second, _checkpoint("3a", "mine"), {"step": 2}, {"x": "mine"})
        latest = saver.get_tuple(_thread())
        assert latest is not None and latest.config == theirs
        assert [t.checkpoint["id"] for t in saver.list(_thread())] == ["3b", "2", "1"]


class _FailsUnstored:
    """A saver's backend whose next put fails unstored (the sidecar unreachable), a task's write landing
    while it is under way, as LangGraph saves the next step's writes while a put runs."""

    def __init__(self, backend: Any, meanwhile: Any) -> None:
        self._backend = backend
        self._meanwhile = meanwhile

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def put(self, *args: Any) -> Any:
        self._meanwhile()
        raise UnavailableError("the sidecar is unreachable", grpc.StatusCode.UNAVAILABLE)


@pytest.mark.parametrize("on", ["embedded", "sidecar"])
def test_writes_saved_while_a_failed_put_was_under_way_come_with_it_put_again(tmp_path: Path, on: str) -> None:
    with _saver(tmp_path, on) as saver:
        first = saver.put(_thread(), _checkpoint("1", "a"), {"step": 0}, {"x": "a"})
        real = saver._backend

        def meanwhile() -> None:
            saver._backend = real
            saver.put_writes(_thread("2"), [("__interrupt__", "approve?")], "task-1")

        saver._backend = _FailsUnstored(real, meanwhile)
        with pytest.raises(UnavailableError):
            saver.put(first, _checkpoint("2", "b"), {"step": 1}, {"x": "b"})
        saver.put(first, _checkpoint("2", "b"), {"step": 1}, {"x": "b"})
        read = saver.get_tuple(_thread())
        assert read is not None and read.pending_writes == [("task-1", "__interrupt__", "approve?")]


# A put that fails unstored while a task's write lands, made again; then a put whose reply is lost, made
# again, and another saver moving the thread before the first one's next step.
_JS_DURING_AND_AFTER = r"""
const { emptyCheckpoint } = require(process.argv[1] + '/node_modules/@langchain/langgraph-checkpoint');
const { CkptSaver } = require(process.argv[1] + '/langgraph.js');
const thread = (id) => ({ configurable: { thread_id: 't', checkpoint_ns: '', ...(id ? { checkpoint_id: id } : {}) } });
const checkpoint = (id, x) => ({ ...emptyCheckpoint(), id, channel_values: { x }, channel_versions: { x } });
const unavailable = () => Object.assign(new Error('14 UNAVAILABLE'), { code: 14 });
(async () => {
  const [saver, other] = [new CkptSaver(process.argv[2]), new CkptSaver(process.argv[2])];
  const append = saver.client.appendEvents.bind(saver.client);
  let mode = null;
  saver.client.appendEvents = async (...args) => {
    if (!(args[2] && args[2].put) || mode === null) return append(...args);
    const now = mode;
    mode = null;
    if (now === 'unstored') {
      await saver.putWrites(thread('2'), [['__interrupt__', 'approve?']], 'task-1');
      throw unavailable();
    }
    await append(...args);
    throw unavailable();
  };
  const out = {};
  const first = await saver.put(thread(), checkpoint('1', 'a'), { step: 0 }, { x: 'a' });
  mode = 'unstored';
  await saver.put(first, checkpoint('2', 'b'), { step: 1 }, { x: 'b' }).catch(() => {});
  const second = await saver.put(first, checkpoint('2', 'b'), { step: 1 }, { x: 'b' });
  out.pending = (await saver.getTuple(thread())).pendingWrites;
  mode = 'lost';
  await saver.put(second, checkpoint('3', 'c'), { step: 2 }, { x: 'c' }).catch(() => {});
  const third = await saver.put(second, checkpoint('3', 'c'), { step: 2 }, { x: 'c' });
  await other.getTuple(thread());
  await other.put(third, checkpoint('4b', 'other'), { step: 3 }, { x: 'other' });
  const mine = saver.put(third, checkpoint('4a', 'mine'), { step: 3 }, { x: 'mine' });
  out.mine = await mine.then(() => null, (e) => e.name);
  out.listed = [];
  for await (const t of saver.list(thread())) out.listed.push(t.checkpoint.id);
  saver.close();
  other.close();
  console.log(JSON.stringify(out));
})().catch((err) => { console.error(err); process.exit(1); });
"""


def test_js_writes_during_a_failed_put_and_writers_after_a_lost_reply(sidecar: Sidecar) -> None:
    assert run_node(_JS_DURING_AND_AFTER, sidecar) == {
        "pending": [["task-1", "__interrupt__", "approve?"]],
        "mine": "CheckpointConflictError",
        "listed": ["4b", "3", "2", "1"],
    }
