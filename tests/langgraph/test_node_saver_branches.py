"""A branch the LangGraph.js saver (clients/node/langgraph.js) writes (a put whose parent is not the head
it remembers: time travel, a saver that never read the thread) follows the thread's head as it is, as the
Python saver's does (operations.py): compare-and-set on that head, the checkpoints deleted from the thread
carried forward, read again and retried when another write lands first."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ckpt.sidecar.langgraph import CkptSaver
from tests.langgraph.test_node_saver import node_process
from tests.langgraph.test_node_saver_records import JsonSerde, thread
from tests.langgraph.test_node_saver_remade_logs import _py_step
from tests.support import Sidecar

# A Node saver writes thread "b" four checkpoints deep (c0, c1 of run "keep", c2, c3 of run "doomed"),
# unless `first` is "first", and prints their ids. It then writes a checkpoint branching from c0 (from no
# checkpoint with "first"), each of its writes of a Step noted: its expected version and whether it
# expected a state XXH3-64. With `pause` "pause", the first such write waits before it is sent: it prints
# a line and reads one (meanwhile the test changes the thread with a Python saver); with "wait", the whole
# branch does. Prints the branch's id, the writes noted and the ids its list() reads.
_BRANCH = r"""
const readline = require('readline');
const { emptyCheckpoint, uuid6 } = require(process.argv[1] + '/node_modules/@langchain/langgraph-checkpoint');
const { CkptSaver } = require(process.argv[1] + '/langgraph.js');
const [target, first, pause] = process.argv.slice(2);
const thread = { configurable: { thread_id: 'b', checkpoint_ns: '' } };
const idOf = (config) => config.configurable.checkpoint_id;
const lines = readline.createInterface({ input: process.stdin });
const next = lines[Symbol.asyncIterator]();
const tell = (obj) => console.log(JSON.stringify(obj));

function step(saver, config, n, run) {
  const versions = { n: n + 1 };
  const checkpoint = { ...emptyCheckpoint(), id: uuid6(-1), channel_values: { n }, channel_versions: versions };
  return saver.put(config, checkpoint, { source: 'loop', step: n, parents: {}, run_id: run }, versions);
}

(async () => {
  const saver = new CkptSaver(target);
  const ids = [];
  if (first !== 'first') {
    let config = thread;
    for (const [n, run] of [[0, 'keep'], [1, 'keep'], [2, 'doomed'], [3, 'doomed']]) {
      config = await step(saver, config, n, run);
      ids.push(idOf(config));
    }
  }
  tell({ ids });
  const writes = [];
  const appendEvents = saver.client.appendEvents.bind(saver.client);
  saver.client.appendEvents = async (sessionId, events, options = {}) => {
    if (options.put) {
      const { expectedVersion, expectedStateXxh3 } = options.put;
      writes.push({ expectedVersion: expectedVersion ?? null, xxh3: expectedStateXxh3 !== undefined });
      if (pause === 'pause' && writes.length === 1) {
        tell({ paused: true });
        await next.next();
      }
    }
    return appendEvents(sessionId, events, options);
  };
  if (pause === 'wait') {
    tell({ paused: true });
    await next.next();
  }
  const from = first === 'first' ? thread : { configurable: { ...thread.configurable, checkpoint_id: ids[0] } };
  const branch = idOf(await step(saver, from, 10, 'branch'));
  lines.close();
  const listed = [];
  for await (const t of saver.list(thread)) listed.push(idOf(t.config));
  saver.close();
  tell({ branch, writes, listed });
})().catch((err) => { console.error(err); process.exit(1); });
"""


def _branch(sidecar: Sidecar, first: str, pause: str, meanwhile: Any) -> tuple[list[str], dict[str, Any]]:
    """Runs _BRANCH; ``meanwhile(ids)`` runs while the Node saver waits. The ids it wrote, and what it printed last."""
    proc = node_process(_BRANCH, sidecar.unix_target, first, pause)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = proc.stdout.readline()
        assert line, proc.communicate(timeout=60)[1]
        ids: list[str] = json.loads(line)["ids"]
        line = proc.stdout.readline()
        assert json.loads(line or "{}") == {"paused": True}, proc.communicate(timeout=60)[1]
        meanwhile(ids)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    return ids, dict(json.loads(stdout))


def _listed(sidecar: Sidecar) -> list[str]:
    with CkptSaver(sidecar.unix_target, serde=JsonSerde()) as py:
        return [t.config["configurable"]["checkpoint_id"] for t in py.list(thread("b"))]


def _head(sidecar: Sidecar) -> str:
    with CkptSaver(sidecar.unix_target, serde=JsonSerde()) as py:
        head = py.get_tuple(thread("b"))
        assert head is not None
        return str(head.config["configurable"]["checkpoint_id"])


@pytest.mark.parametrize("pause", ["wait", "pause"], ids=["deleted-before-the-branch", "deleted-during-the-branch"])
def test_checkpoints_a_python_saver_deleted_stay_deleted_after_a_node_branch(sidecar: Sidecar, pause: str) -> None:
    def delete_doomed(_: list[str]) -> None:
        with CkptSaver(sidecar.unix_target, serde=JsonSerde()) as py:
            py.delete_for_runs(["doomed"])

    ids, out = _branch(sidecar, "deep", pause, delete_doomed)
    # The branch is the head; c2 and c3 stay deleted for the Node saver and the Python saver alike.
    assert out["listed"] == [out["branch"], ids[1], ids[0]]
    assert _listed(sidecar) == out["listed"]
    with CkptSaver(sidecar.unix_target, serde=JsonSerde()) as py:
        head = py.get_tuple(thread("b"))
        assert head is not None and head.checkpoint["channel_values"] == {"n": 10}
        assert head.parent_config is not None and head.parent_config["configurable"]["checkpoint_id"] == ids[0]
        assert py.get_tuple(thread("b", ids[3])) is None


def test_a_node_branch_write_expects_the_head_it_read_and_retries_on_the_one_that_moved_it(sidecar: Sidecar) -> None:
    other: list[str] = []

    def write_after(ids: list[str]) -> None:
        with CkptSaver(sidecar.unix_target, serde=JsonSerde()) as py:
            other.append(_py_step(py, thread("b", ids[3]), 4, "other")["configurable"]["checkpoint_id"])

    ids, out = _branch(sidecar, "deep", "pause", write_after)
    # Its first write expected the head it read (version 4, its state's XXH3-64), lost to the Python
    # saver's checkpoint (version 5), and was written again after that one.
    assert out["writes"] == [{"expectedVersion": 4, "xxh3": True}, {"expectedVersion": 5, "xxh3": True}]
    assert _head(sidecar) == out["branch"]
    # Listed newest checkpoint id first: the Python saver's, made after the branch's, is kept too.
    assert sorted(_listed(sidecar)) == sorted([*ids, out["branch"], other[0]]) == sorted(out["listed"])


def test_a_node_saver_starting_a_thread_another_saver_started_meanwhile_writes_after_it(sidecar: Sidecar) -> None:
    started: list[str] = []

    def start(_: list[str]) -> None:
        with CkptSaver(sidecar.unix_target, serde=JsonSerde()) as py:
            started.append(_py_step(py, thread("b"), 0, "other")["configurable"]["checkpoint_id"])

    _, out = _branch(sidecar, "first", "pause", start)
    # It expected no thread (version 0), found the other's checkpoint there, and wrote after it.
    assert out["writes"] == [{"expectedVersion": 0, "xxh3": False}, {"expectedVersion": 1, "xxh3": True}]
    assert _head(sidecar) == out["branch"]
    assert sorted(_listed(sidecar)) == sorted([out["branch"], *started]) == sorted(out["listed"])
