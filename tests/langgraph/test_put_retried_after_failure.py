"""Writes saved before their checkpoint's put (as LangGraph does) come with that checkpoint when its put
failed once (the sidecar down) and is made again: the saver keeps where those writes are until a put of
the checkpoint succeeds. Python and LangGraph.js savers, on a real sidecar stopped and started again."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6

from ckpt.sidecar.client import UnavailableError
from ckpt.sidecar.langgraph import CkptSaver
from tests.langgraph.test_node_saver import NODE_CLIENT, _node
from tests.support import start_sidecar


def _thread(checkpoint_id: str | None = None) -> Any:
    configurable = {"thread_id": "t", "checkpoint_ns": ""}
    if checkpoint_id:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


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
    node = subprocess.Popen(
        [_node(), "-e", _JS, str(NODE_CLIENT), sidecar.unix_target],
        cwd=NODE_CLIENT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
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
