"""The LangGraph.js saver (clients/node/langgraph.js) and writes saved before their checkpoint's put, as
the Python saver's (test_saver_sidecar.py, test_saver_thread_removal.py): kept when another saver made the
thread's log anew meanwhile, removed by deleteThread when the namespace has no checkpoint yet."""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.base.id import uuid6

from ckpt.sidecar.client import CheckpointClient
from ckpt.sidecar.langgraph import CkptSaver
from ckpt.v1 import service_pb2
from tests.langgraph.test_node_saver_records import JsonSerde, run_node
from tests.langgraph.test_saver_sidecar import thread
from tests.support import Sidecar

_PRELUDE = r"""
const { emptyCheckpoint, uuid6 } = require(process.argv[1] + '/node_modules/@langchain/langgraph-checkpoint');
const { CkptSaver } = require(process.argv[1] + '/langgraph.js');
const target = process.argv[2];
const thread = (id, ns = '') => ({ configurable: { thread_id: id, checkpoint_ns: ns } });
const newCheckpoint = (n) => ({
  ...emptyCheckpoint(), id: uuid6(-1), channel_values: { n }, channel_versions: { n: n + 1 },
});
const put = (saver, config, checkpoint) => {
  const n = checkpoint.channel_values.n;
  return saver.put(config, checkpoint, { source: 'loop', step: n, parents: {} }, { n: n + 1 });
};
const early = (config, checkpoint) => ({ configurable: { ...config.configurable, checkpoint_id: checkpoint.id } });
"""

# Saver A writes a checkpoint and 20 writes; saver B deletes the thread and starts it again; A saves a write
# of its next checkpoint, then puts that checkpoint after B's. Prints the checkpoint's config and the
# pending writes A, B and a fresh saver read of it.
_REMADE = (
    _PRELUDE
    + r"""
(async () => {
  const [a, b, fresh] = [new CkptSaver(target), new CkptSaver(target), new CkptSaver(target)];
  const old = await put(a, thread('remade'), newCheckpoint(0));
  for (let i = 0; i < 20; i++) await a.putWrites(old, [['n', i]], `task-${i}`);
  await b.deleteThread('remade');
  const restarted = await put(b, thread('remade'), newCheckpoint(0));
  const checkpoint = newCheckpoint(1);
  const config = early(thread('remade'), checkpoint);
  await a.putWrites(config, [['__interrupt__', 'approve?']], 'task-x');
  await put(a, restarted, checkpoint);
  const pending = [];
  for (const saver of [a, b, fresh]) pending.push((await saver.getTuple(config)).pendingWrites);
  for (const saver of [a, b, fresh]) saver.close();
  console.log(JSON.stringify({ config, pending }));
})().catch((err) => { console.error(err); process.exit(1); });
"""
)

# For each namespace: writes saved to a checkpoint not yet put, deleteThread, then that checkpoint put.
# Prints the pending writes read of it.
_DELETED = (
    _PRELUDE
    + r"""
(async () => {
  const saver = new CkptSaver(target);
  const pending = {};
  for (const ns of ['', 'sub']) {
    const checkpoint = newCheckpoint(0);
    const writes = [['messages', 'secret'], ['__interrupt__', 'approve?']];
    await saver.putWrites(early(thread('gone', ns), checkpoint), writes, 'task-1');
    await saver.deleteThread('gone');
    await put(saver, thread('gone', ns), checkpoint);
    pending[ns] = (await saver.getTuple(thread('gone', ns))).pendingWrites;
    await saver.deleteThread('gone');
  }
  await saver.putWrites(early(thread('gone', 'tools'), newCheckpoint(0)), [['n', 'early']], 'task');
  await saver.deleteThread('gone');
  saver.close();
  console.log(JSON.stringify({ pending }));
})().catch((err) => { console.error(err); process.exit(1); });
"""
)

# The error a put and a getTuple get for a namespace too long for the thread.
_TOO_LONG = (
    _PRELUDE
    + r"""
(async () => {
  const saver = new CkptSaver(target);
  const errors = [];
  const config = thread('t', 'n'.repeat(400));
  for (const call of [() => put(saver, config, newCheckpoint(0)), () => saver.getTuple(config)]) {
    try {
      await call();
      errors.push(null);
    } catch (err) {
      errors.push(`${err.name}: ${err.message}`);
    }
  }
  saver.close();
  console.log(JSON.stringify({ errors }));
})().catch((err) => { console.error(err); process.exit(1); });
"""
)


# Thread 'gone' with a checkpoint in namespace '' and writes alone in 'tools'; deleteThread with every
# ListSessions reply recorded. Prints the session ids of each reply, by page.
_LISTED = (
    _PRELUDE
    + r"""
(async () => {
  const saver = new CkptSaver(target);
  await put(saver, thread('gone'), newCheckpoint(0));
  await saver.putWrites(early(thread('gone', 'tools'), newCheckpoint(1)), [['n', 'early']], 'task');
  const pages = [];
  const call = saver.client.call.bind(saver.client);
  saver.client.call = async (method, request) => {
    const reply = await call(method, request);
    if (method === 'ListSessions') pages.push(reply.sessions.map((s) => s.session_id));
    return reply;
  };
  await saver.deleteThread('gone');
  saver.close();
  console.log(JSON.stringify({ pages }));
})().catch((err) => { console.error(err); process.exit(1); });
"""
)


def test_node_saver_delete_thread_reads_the_threads_sessions_and_no_others(sidecar: Sidecar) -> None:
    """deleteThread found a namespace holding writes alone in the listing of every session: with 2,500
    unrelated sessions it read three pages of 1,000. It lists the thread's prefix now."""
    with CheckpointClient(sidecar.unix_target) as client:
        puts = (service_pb2.PutRequest(session_id=f"other/{i:05d}", state=b"") for i in range(2500))
        assert not [r for r in client.put_stream(puts, batch_size=500) if r.HasField("error")]
        pages = run_node(_LISTED, sidecar)["pages"]
        # A page for the thread's label, one for its prefix: the thread's sessions alone.
        assert pages == [["langgraph/4/gone/"], ["langgraph/4/gone/", "langgraph/4/gone/tools"]]
        assert [s.session_id for s in client.sessions(prefix="langgraph/")] == []


def test_node_saver_keeps_a_write_saved_before_its_checkpoint_after_another_saver_made_the_thread_anew(
    sidecar: Sidecar,
) -> None:
    """Saver A remembered a seq far into the thread's old log; its early write landed at seq 3 of the new
    one, and the checkpoint named the old log's seq as the one its writes came after: the write was lost."""
    out = run_node(_REMADE, sidecar)
    written = [["task-x", "__interrupt__", "approve?"]]
    assert out["pending"] == [written] * 3
    with CkptSaver(sidecar.tcp_target, serde=JsonSerde()) as python:
        found = python.get_tuple(out["config"])
        assert found is not None and [list(w) for w in found.pending_writes or []] == written


def test_node_saver_delete_thread_removes_writes_saved_before_a_namespaces_first_checkpoint(
    sidecar: Sidecar,
) -> None:
    """A session put_writes made has no labels (they come with a put): deleteThread, finding sessions by
    label, left the writes, and they came back when that checkpoint was put."""
    with CkptSaver(sidecar.tcp_target, serde=JsonSerde()) as python:
        kept = thread("other", checkpoint_id=str(uuid6(clock_seq=-1)))
        python.put_writes(kept, [("n", "kept")], "task")
        assert run_node(_DELETED, sidecar) == {"pending": {"": [], "sub": []}}
        with CheckpointClient(sidecar.unix_target) as client:
            assert [s.session_id for s in client.sessions()] == ["langgraph/5/other/"]


def test_node_saver_names_the_limit_on_thread_id_and_checkpoint_ns_on_put_and_reads(sidecar: Sidecar) -> None:
    message: Any = (
        "RangeError: thread_id and checkpoint_ns are 401 bytes of UTF-8 together; ckpt's savers take at most 243"
        " (256, a session id's limit, less the 13 bytes they are stored with)"
    )
    assert run_node(_TOO_LONG, sidecar) == {"errors": [message, message]}
