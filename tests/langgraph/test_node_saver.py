"""The LangGraph.js checkpointer (clients/node/langgraph.js) against a real sidecar: LangGraph's own
conformance suite for checkpointers, and real graphs run by two savers on one thread."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import lmdb

from ckpt.langgraph.v1 import records_pb2
from ckpt.sidecar.client import CheckpointClient
from ckpt.v1 import service_pb2
from tests.support import ROOT, start_sidecar

NODE_CLIENT = ROOT / "clients" / "node"
VALIDATION = NODE_CLIENT / "test" / "langgraph_validation.test.mjs"
SUITES = ("put", "putWrites", "getTuple", "list", "deleteThread", "getDeltaChannelHistory")
_NOT_INSTALLED = "node is not installed: `make test` (or .ci/run) installs what the tests need"


def _node() -> str:
    node = shutil.which("node")
    assert node, _NOT_INSTALLED
    assert (NODE_CLIENT / "node_modules" / "@langchain" / "langgraph-checkpoint-validation").is_dir(), (
        "run `make install` (npm install in clients/node)"
    )
    return node


def node_process(script: str, target: str, *args: str) -> subprocess.Popen[str]:
    """``script`` run by Node in clients/node (argv: the client's directory, ``target``, ``args``), its
    stdin, stdout and stderr piped as text: a test speaks with it line by line."""
    return subprocess.Popen(
        [_node(), "-e", script, str(NODE_CLIENT), target, *args],
        cwd=NODE_CLIENT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def node_output(script: str, *args: str, timeout_seconds: float = 120) -> str:
    """``script`` run to its end by Node in clients/node (argv: the client's directory, ``args``): its
    stdout, once it exited 0 (else the test fails with its stderr)."""
    proc = subprocess.run(
        [_node(), "-e", script, str(NODE_CLIENT), *args],
        cwd=NODE_CLIENT,
        capture_output=True,
        text=True,
        timeout=timeout_seconds,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_langgraph_js_conformance_suite_passes_every_case(tmp_path: Path) -> None:
    node = _node()
    results = tmp_path / "results.json"
    sidecar = start_sidecar(tmp_path / "data")
    try:
        proc = subprocess.run(
            [
                node,
                str(NODE_CLIENT / "node_modules" / "vitest" / "vitest.mjs"),
                "run",
                "--globals",
                "--reporter=json",
                f"--outputFile={results}",
                str(VALIDATION.relative_to(NODE_CLIENT)),
            ],
            cwd=NODE_CLIENT,
            env={**os.environ, "CKPT_TARGET": sidecar.unix_target, "CI": "true", "NO_COLOR": "1"},
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        assert sidecar.stop() == 0
    assert results.is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(results.read_text())
    cases = [case for suite in report["testResults"] for case in suite["assertionResults"]]
    not_passed = [
        (case["fullName"], case["status"], case["failureMessages"][:1]) for case in cases if case["status"] != "passed"
    ]
    assert not_passed == [], not_passed  # a skipped case (the suite skips some per saver) fails too
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["numFailedTestSuites"] == 0 and report["numPendingTests"] == 0
    names = [case["fullName"] for case in cases]
    ran = {suite: sum(f"#{suite} " in name for name in names) for suite in SUITES}
    # Every suite ran: put, putWrites, getTuple, list (its 648 argument combinations and one more),
    # deleteThread, and the opt-in getDeltaChannelHistory one.
    assert ran == {
        "put": 22,
        "putWrites": 6,
        "getTuple": 40,
        "list": 649,
        "deleteThread": 1,
        "getDeltaChannelHistory": 8,
    }
    assert sum(ran.values()) == len(cases)
    assert any("#put should only store channel_values that have changed" in name for name in names)
    assert sum("should migrate pending sends" in name for name in names) == 3


# Two savers on one thread, as two processes of an agent would be. Saver a's run stops in its node
# (after its checkpoint before the node is stored) while b runs the same thread to the end: a's next
# checkpoint would fork the thread, so its run fails with CheckpointConflictError; run again, it
# resumes from b's head. Then a branch from the first run's last checkpoint, on purpose.
_TWO_WRITERS = r"""
const { StateGraph, Annotation, START, END } = require('@langchain/langgraph');
const { CkptSaver, CheckpointConflictError } = require(process.argv[1]);
const target = process.argv[2];

class CountingSaver extends CkptSaver {
  constructor(...args) {
    super(...args);
    this.puts = 0;
    this.waiters = [];
  }
  async put(...args) {
    const config = await super.put(...args);
    this.puts += 1;
    for (const w of this.waiters.splice(0)) w();
    return config;
  }
  async putsReach(n) {
    while (this.puts < n) await new Promise((r) => this.waiters.push(r));
  }
}

const State = Annotation.Root({ log: Annotation({ reducer: (a, b) => a.concat(b), default: () => [] }) });
let hold = null;
const build = (saver) =>
  new StateGraph(State)
    .addNode('step', async (s) => {
      if (hold) await hold(); // a's node waits to be let go
      return { log: [`step after ${s.log.length}`] };
    })
    .addEdge(START, 'step')
    .addEdge('step', END)
    .compile({ checkpointer: saver });

(async () => {
  const a = new CountingSaver(target);
  const b = new CkptSaver(target);
  const ga = build(a);
  const gb = build(b);
  const config = { configurable: { thread_id: 'chat/1' } };
  const out = {};
  out.first = (await ga.invoke({ log: ['hi'] }, config)).log;
  const putsBefore = a.puts;
  let release;
  const released = new Promise((r) => { release = r; });
  let started;
  const begun = new Promise((r) => { started = r; });
  hold = () => { started(); return released; };
  const raced = ga.invoke({ log: ['from a'] }, config).then(
    (s) => ({ log: s.log }),
    (e) => ({ error: e.name, conflict: e instanceof CheckpointConflictError, message: e.message }),
  );
  await begun;
  await a.putsReach(putsBefore + 2); // its input and its checkpoint before the node are stored
  hold = null;
  out.other = (await gb.invoke({ log: ['from b'] }, config)).log;
  release();
  out.raced = await raced;
  out.again = (await ga.invoke({ log: ['again'] }, config)).log;
  const history = [];
  for await (const t of a.list(config)) history.push(t);
  const same = (log) => JSON.stringify(log) === JSON.stringify(out.first);
  const firstEnd = history.find((t) => t.metadata.source === 'loop' && same(t.checkpoint.channel_values.log));
  out.branch = (await ga.invoke({ log: ['branch'] }, firstEnd.config)).log;
  out.latest = (await ga.getState(config)).values.log;
  const ids = [];
  for await (const t of b.list(config)) ids.push(t.checkpoint.id);
  out.ids = ids;
  a.close();
  b.close();
  console.log(JSON.stringify(out));
})().catch((err) => { console.error(err); process.exit(1); });
"""


def _types_generation(data: Path) -> bytes | None:
    env = lmdb.open(str(data / "lmdb"), max_dbs=16, readonly=True)
    try:
        with env.begin() as txn:
            return txn.get(b"types_generation", db=env.open_db(b"meta", txn=txn, create=False))
    finally:
        env.close()


def test_langgraph_js_graphs_on_one_thread_never_fork_it_silently(tmp_path: Path) -> None:
    node = _node()
    sidecar = start_sidecar(tmp_path / "data")
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            # The Python saver's registration first: the Node saver's must then change nothing.
            assert "ckpt.langgraph.v1.Step" in client.register_type(records_pb2.Step)
            proc = subprocess.run(
                [node, "-e", _TWO_WRITERS, str(NODE_CLIENT / "langgraph.js"), sidecar.unix_target],
                cwd=NODE_CLIENT,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert proc.returncode == 0, proc.stderr
            out: dict[str, Any] = json.loads(proc.stdout)
            sessions = list(client.sessions(labels={"langgraph.thread": "chat/1"}))
            session = sessions[0].session_id
            versions = list(client.history(session))[::-1]
            steps = [records_pb2.Step.FromString(client.get(session, v.version).state) for v in versions]
            events = list(client.events(session))
    finally:
        assert sidecar.stop() == 0
    assert out["first"] == ["hi", "step after 1"]
    assert out["raced"]["conflict"] is True and out["raced"]["error"] == "CheckpointConflictError"
    assert "another writer wrote it" in out["raced"]["message"]
    assert out["other"] == ["hi", "step after 1", "from a", "from b", "step after 4"]
    assert out["again"] == out["other"] + ["again", "step after 6"]
    assert out["branch"] == ["hi", "step after 1", "branch", "step after 3"]
    assert out["latest"] == out["branch"]

    # The layout shared with the Python saver: one typed session per namespace, a Step per checkpoint.
    assert [s.session_id for s in sessions] == ["langgraph/6/chat/1/"]
    assert sessions[0].message_type == "ckpt.langgraph.v1.Step"
    ids = [s.checkpoint_id for s in steps]
    assert out["ids"] == ids[::-1]  # listed newest first
    assert [v.labels["langgraph.id"] for v in versions] == ids
    assert all(v.labels["langgraph.thread"] == "chat/1" for v in versions)
    # Each checkpoint continuing the head it read is a MERGE patch; the thread's first and the branch
    # are written whole.
    modes = [v.mode for v in versions]
    branch_at = next(i for i, s in enumerate(steps) if i and s.parent_checkpoint_id != steps[i - 1].checkpoint_id)
    assert steps[branch_at].parent_checkpoint_id in ids[:branch_at]
    assert [i for i, m in enumerate(modes) if m != service_pb2.WRITE_MODE_MERGE] == [0, branch_at], modes
    assert all(s.checkpoint.type == "json" and s.metadata.type == "json" for s in steps)
    # The run that lost the race stored no checkpoint: every step's parent is one stored.
    assert all(s.parent_checkpoint_id in ids for s in steps[1:])
    # The log holds the pending writes alone (a put appends no event), each of a checkpoint stored.
    assert {e.type for e in events} == {"langgraph.writes"}
    writes = [records_pb2.Writes.FromString(e.payload) for e in events]
    assert all(w.checkpoint_id in ids and w.task_id for w in writes)
    assert _types_generation(tmp_path / "data") == b"1"


def _js_block(page: Path, heading: str) -> str:
    section = re.split(rf"^{re.escape(heading)}$", page.read_text(), maxsplit=1, flags=re.M)[1]
    return section.split("```js\n", 1)[1].split("```", 1)[0]


def test_the_langgraph_js_example_of_the_docs_runs(tmp_path: Path) -> None:
    node = _node()
    # A project that installed the client (npm links a folder dependency) next to a `make run` sidecar.
    (tmp_path / "node_modules").mkdir()
    (tmp_path / "node_modules" / "ckpt-client").symlink_to(NODE_CLIENT, target_is_directory=True)
    (tmp_path / "example.js").write_text(_js_block(ROOT / "docs" / "langgraph.md", "## JavaScript (LangGraph.js)"))
    sidecar = start_sidecar(tmp_path / "data", socket_path=tmp_path / "data" / "ckpt.sock")
    try:
        proc = subprocess.run(
            [node, "example.js"],
            cwd=tmp_path,
            env={**os.environ, "NODE_PATH": str(NODE_CLIENT / "node_modules")},  # where @langchain/langgraph is
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        assert sidecar.stop() == 0
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ['["hello","echo: hello","again","echo: again"]', "loop 4", "loop 3"]


# Threads whose ids hold '/' and a character outside the BMP, pending writes folded, and the errors;
# with "delete", the deletion of one thread.
_EDGES = r"""
const { emptyCheckpoint, uuid6 } = require(process.argv[1] + '/node_modules/@langchain/langgraph-checkpoint');
const { CkptSaver } = require(process.argv[1] + '/langgraph.js');
const saver = new CkptSaver(process.argv[2]);
const parrot = 'a/\u{1F99C}';
const failure = async (fn) => {
  try {
    await fn();
    return null;
  } catch (err) {
    return `${err.name}: ${err.message}`;
  }
};
const listed = async (config) => {
  const seen = [];
  for await (const { config: c } of saver.list(config)) {
    seen.push([c.configurable.thread_id, c.configurable.checkpoint_ns]);
  }
  return seen.sort();
};
const put = (threadId, ns, metadata = { source: 'input', step: -1, parents: {} }) => {
  const checkpoint = { ...emptyCheckpoint(), id: uuid6(-1) };
  return saver.put({ configurable: { thread_id: threadId, checkpoint_ns: ns } }, checkpoint, metadata, {});
};
(async () => {
  const out = {};
  if (process.argv[3] === 'delete') {
    await saver.deleteThread(parrot);
    out.afterDelete = await listed({});
  } else {
    const config = await put(parrot, 'sub/x', { source: 'loop', step: 0, parents: {}, run_id: 'run-1' });
    await put(parrot, '');
    await put('a', '\u{1F99C}/sub/x');
    await saver.putWrites(config, [['c', 1], ['c', 2]], 't1');
    await saver.putWrites(config, [['c', 9]], 't1'); // idx 0 of t1 again: the first write stays
    await saver.putWrites(config, [['__error__', 'e1']], 't2');
    await saver.putWrites(config, [['__error__', 'e2']], 't2'); // a special channel: the last write stays
    await saver.putWrites(config, [['c', 'late']], 'a', '~2');
    await saver.putWrites(config, [['c', 'early']], 'b', '~1');
    out.writes = (await saver.getTuple(config)).pendingWrites;
    out.thread = await listed({ configurable: { thread_id: parrot } });
    out.all = await listed({});
    // A checkpoint id without a thread lists that checkpoint only, as MemorySaver and the Python saver do.
    out.byIdOnly = await listed({ configurable: { checkpoint_id: config.configurable.checkpoint_id } });
    out.missing = (await saver.getTuple({ configurable: { thread_id: 'nobody' } })) === undefined;
    out.long = await failure(() => put('x'.repeat(129), ''));
    out.control = await failure(() => put('a\nb', ''));
    out.controlNs = await failure(() => saver.getTuple({ configurable: { thread_id: 't', checkpoint_ns: 'sub\x00' } }));
    out.noThread = await failure(() => put(undefined, ''));
    out.noCheckpoint = await failure(() => saver.putWrites({ configurable: { thread_id: 'a' } }, [['c', 1]], 't'));
    // Two savers find a thread empty; the second to write its first checkpoint would start it twice.
    const other = new CkptSaver(process.argv[2]);
    const fresh = { configurable: { thread_id: 'fresh' } };
    out.empty = [await saver.getTuple(fresh), await other.getTuple(fresh)].map((t) => t === undefined);
    await put('fresh', '');
    out.second = await failure(() => other.put(fresh, { ...emptyCheckpoint(), id: uuid6(-1) }, {}, {}));
    other.close();
  }
  saver.close();
  console.log(JSON.stringify(out));
})().catch((err) => { console.error(err); process.exit(1); });
"""


def test_langgraph_js_saver_names_threads_and_folds_writes_as_the_python_saver_does(tmp_path: Path) -> None:
    sidecar = start_sidecar(tmp_path / "data")

    def run(*args: str) -> dict[str, Any]:
        return dict(json.loads(node_output(_EDGES, sidecar.unix_target, *args, timeout_seconds=60)))

    try:
        out = run()
        with CheckpointClient(sidecar.unix_target) as client:
            sessions = {s.session_id: s.labels["langgraph.thread"] for s in client.sessions()}
            labels = [dict(v.labels) for v in client.history("langgraph/3/a/\N{PARROT}/sub/x")]
        deleted = run("delete")
    finally:
        assert sidecar.stop() == 0
    parrot = "a/\N{PARROT}"
    # The length in a session id counts code points, as Python's len() does, so a thread id may hold '/'.
    assert len(parrot) == 3
    assert sessions == {
        "langgraph/5/fresh/": "fresh",
        "langgraph/1/a/\N{PARROT}/sub/x": "a",
        "langgraph/3/a/\N{PARROT}/": parrot,
        "langgraph/3/a/\N{PARROT}/sub/x": parrot,
    }
    assert labels == [{"langgraph.thread": parrot, "langgraph.id": labels[0]["langgraph.id"], "langgraph.run": "run-1"}]
    assert out["writes"] == [
        ["t1", "c", 1],
        ["t1", "c", 2],
        ["t2", "__error__", "e2"],
        ["b", "c", "early"],
        ["a", "c", "late"],
    ]
    assert out["thread"] == [[parrot, ""], [parrot, "sub/x"]]
    assert out["all"] == [["a", "\N{PARROT}/sub/x"], [parrot, ""], [parrot, "sub/x"]]  # before "fresh"
    assert out["byIdOnly"] == [[parrot, "sub/x"]]
    assert out["missing"] is True
    assert out["long"] == (
        "RangeError: thread_id is 129 bytes of UTF-8; ckpt's LangGraph saver takes at most 128 (a label's limit)"
    )
    assert out["control"] == (
        'RangeError: thread_id "a\\nb" contains an ASCII control character (U+0000-U+001F or U+007F):'
        " ckpt's savers cannot store it"
    )
    assert out["controlNs"].startswith('RangeError: checkpoint_ns "sub\\u0000" contains an ASCII control character')
    assert out["noThread"].startswith("Error: put: the config's configurable has no thread_id")
    assert out["noCheckpoint"].startswith("Error: putWrites: the config's configurable has no checkpoint_id")
    assert out["empty"] == [True, True]
    assert out["second"] == (
        'CheckpointConflictError: thread "fresh" (checkpoint_ns "") moved on since this saver read it without'
        " checkpoints; the head is version 1: another writer wrote it; run the thread again to resume from its new head"
    )
    assert deleted["afterDelete"] == [["a", "\N{PARROT}/sub/x"], ["fresh", ""]]
