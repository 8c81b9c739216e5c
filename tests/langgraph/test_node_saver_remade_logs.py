"""The LangGraph.js saver (clients/node/langgraph.js) after another saver made a thread's log anew: it
deleted and restarted the thread, pruned it or cut its runs, so that its log began again at seq 1. The
Node saver's next checkpoint and its pending writes read back whole, as the Python saver's do
(test_saver_sidecar.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6

from ckpt.sidecar.langgraph import CkptSaver
from tests.langgraph.test_node_saver import node_process
from tests.langgraph.test_node_saver_records import JsonSerde, thread
from tests.support import Sidecar

# A Node saver writes thread "remade" ten checkpoints deep, each with an interrupt and a task's write;
# with "delete", a second Node saver deletes the thread and writes a new one. It prints the last config
# and waits for a line on stdin (meanwhile the test may prune or cut the thread with a Python saver). The
# first saver then reads the thread and puts after what it read ("read"), or puts a new branch without
# reading ("branch"), with its writes. Prints that checkpoint's id and, for the first saver, the second
# and a fresh one, the id and pending writes getTuple reads of the thread.
_REMADE = r"""
const readline = require('readline');
const { emptyCheckpoint, uuid6 } = require(process.argv[1] + '/node_modules/@langchain/langgraph-checkpoint');
const { CkptSaver } = require(process.argv[1] + '/langgraph.js');
const [target, rebuild, mode] = process.argv.slice(2);
const thread = (id) => ({ configurable: { thread_id: id, checkpoint_ns: '' } });

async function step(saver, config, n, run = 'run-a') {
  const versions = { n: n + 1 };
  const checkpoint = { ...emptyCheckpoint(), id: uuid6(-1), channel_values: { n }, channel_versions: versions };
  const written = await saver.put(config, checkpoint, { source: 'loop', step: n, parents: {}, run_id: run }, versions);
  await saver.putWrites(written, [['__interrupt__', `ask ${n}`], ['n', n]], `task-${n}`);
  return written;
}

(async () => {
  const lines = readline.createInterface({ input: process.stdin });
  const next = lines[Symbol.asyncIterator]();
  const [first, second, fresh] = [new CkptSaver(target), new CkptSaver(target), new CkptSaver(target)];
  let config = thread('remade');
  for (let n = 0; n < 10; n++) config = await step(first, config, n);
  if (rebuild === 'delete') {
    await second.deleteThread('remade');
    await step(second, thread('remade'), 100, 'run-b');
  }
  console.log(JSON.stringify(config));
  await next.next();
  lines.close();
  const parent = mode === 'read' ? (await first.getTuple(thread('remade'))).config : thread('remade');
  const written = await step(first, parent, 101);
  const reads = [];
  for (const saver of [first, second, fresh]) {
    const t = await saver.getTuple(thread('remade'));
    reads.push({ id: t.config.configurable.checkpoint_id, pending: t.pendingWrites });
  }
  for (const saver of [first, second, fresh]) saver.close();
  console.log(JSON.stringify({ written: written.configurable.checkpoint_id, reads }));
})().catch((err) => { console.error(err); process.exit(1); });
"""


def _py_step(saver: CkptSaver, config: Any, n: int, run: str) -> Any:
    checkpoint: Any = {**empty_checkpoint(), "v": 4, "id": str(uuid6(clock_seq=-1))}
    checkpoint.update(channel_values={"n": n}, channel_versions={"n": n + 1})
    written = saver.put(config, checkpoint, {"source": "loop", "step": n, "parents": {}, "run_id": run}, {"n": n + 1})
    saver.put_writes(written, [("__interrupt__", f"ask {n}"), ("n", n)], f"task-{n}")
    return written


@pytest.mark.parametrize("mode", ["read", "branch"], ids=["read-then-put", "put-a-branch"])
@pytest.mark.parametrize("rebuild", ["delete", "prune", "delete_for_runs"])
def test_node_saver_keeps_writes_after_another_saver_makes_the_threads_log_anew(
    sidecar: Sidecar, rebuild: str, mode: str
) -> None:
    proc = node_process(_REMADE, sidecar.unix_target, rebuild, mode)
    assert proc.stdin is not None and proc.stdout is not None
    with CkptSaver(sidecar.tcp_target, serde=JsonSerde()) as second:
        try:
            line = proc.stdout.readline()
            assert line, proc.communicate(timeout=60)[1]
            if rebuild == "prune":
                second.prune(["remade"], strategy="keep_latest")
            elif rebuild == "delete_for_runs":
                _py_step(second, json.loads(line), 100, run="run-b")
                second.delete_for_runs(["run-a"])
            proc.stdin.write("go\n")
            proc.stdin.flush()
            stdout, stderr = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, stderr
        out = json.loads(stdout)
        pending = [["task-101", "__interrupt__", "ask 101"], ["task-101", "n", 101]]
        # Every Node saver, the one that wrote it among them, reads the new checkpoint with exactly its writes.
        assert out["reads"] == [{"id": out["written"], "pending": pending}] * 3
        # So do the Python saver that rebuilt the thread and a fresh one.
        for saver in (second, CkptSaver(sidecar.unix_target, serde=JsonSerde())):
            found = saver.get_tuple(thread("remade"))
            assert found is not None and found.pending_writes is not None
            assert found.config["configurable"]["checkpoint_id"] == out["written"]
            assert [list(w) for w in found.pending_writes] == pending
