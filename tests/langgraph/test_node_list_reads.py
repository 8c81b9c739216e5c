"""What the LangGraph.js saver's ``list`` reads through a real sidecar: a page of a namespace's history with
its states per call, not a Get per checkpoint; nothing newer than ``before`` and nothing past ``limit``;
and the same checkpoints, writes and all, as a ``getTuple`` of each one listed."""

from __future__ import annotations

import json
from typing import Any

from ckpt.sidecar.langgraph import CkptSaver
from tests.langgraph.test_node_saver_records import JsonSerde, run_node
from tests.support import Sidecar

STEPS = 30
CHILD_STEPS = 3
RUN_DELETED = "run-deleted"

# Thread "t": STEPS checkpoints in its root namespace, each with a pending write, metadata step n and a
# growing list channel; CHILD_STEPS in namespace "child". Thread "d": STEPS checkpoints, the newest 5 of
# them of run RUN_DELETED. Prints the root's and "d"'s checkpoint ids, newest first.
_WRITE = r"""
const { emptyCheckpoint, uuid6 } = require(process.argv[1] + '/node_modules/@langchain/langgraph-checkpoint');
const { CkptSaver } = require(process.argv[1] + '/langgraph.js');
const [target, steps, childSteps, deletedRun] = process.argv.slice(2);
const saver = new CkptSaver(target);
async function write(threadId, ns, n, runOf) {
  let config = { configurable: { thread_id: threadId, checkpoint_ns: ns } };
  const ids = [];
  for (let step = 0; step < n; step++) {
    const log = Array.from({ length: step % 5 }, (_, i) => `entry ${i}`);
    const versions = { n: step + 1, log: step + 1 };
    const values = { n: step, log };
    const checkpoint = { ...emptyCheckpoint(), id: uuid6(-1), channel_values: values, channel_versions: versions };
    const metadata = { source: 'loop', step, parents: {}, run_id: runOf(step) };
    config = await saver.put(config, checkpoint, metadata, versions);
    await saver.putWrites(config, [['n', `write of ${step}`]], `task-${step}`);
    ids.unshift(checkpoint.id);
  }
  return ids;
}
(async () => {
  const root = await write('t', '', Number(steps), () => 'run-t');
  await write('t', 'child', Number(childSteps), () => 'run-t');
  const d = await write('d', '', Number(steps), (step) => (step >= Number(steps) - 5 ? deletedRun : 'run-d'));
  saver.close();
  console.log(JSON.stringify({ root, d }));
})().catch((e) => { console.error(e); process.exit(1); });
"""

# Each case's list through a fresh saver whose client records every call: [method, page_size,
# start_version, include_states]; and the same checkpoints read one getTuple each.
_LIST = r"""
const { CkptSaver } = require(process.argv[1] + '/langgraph.js');
const [target, casesJson] = process.argv.slice(2);
const plain = (t) => JSON.parse(JSON.stringify(t));
(async () => {
  const out = {};
  for (const [name, { config, options, stopAfter }] of Object.entries(JSON.parse(casesJson))) {
    const saver = new CkptSaver(target);
    const calls = [];
    const call = saver.client.call.bind(saver.client);
    saver.client.call = (method, request, ...rest) => {
      calls.push([method, request.page_size ?? null, request.start_version ?? null, request.include_states ?? null]);
      return call(method, request, ...rest);
    };
    const listed = [];
    for await (const t of saver.list(config, options)) {
      listed.push(plain(t));
      if (listed.length === stopAfter) break;
    }
    saver.client.call = call;
    // One getTuple per checkpoint listed: a Get of each, what list read before.
    const one = [];
    for (const t of listed) one.push(plain(await saver.getTuple(t.config)));
    out[name] = { listed, one, calls };
    saver.close();
  }
  console.log(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(1); });
"""


def thread(thread_id: str, ns: str | None = "", checkpoint_id: str | None = None) -> dict[str, Any]:
    configurable: dict[str, Any] = {"thread_id": thread_id}
    if ns is not None:
        configurable["checkpoint_ns"] = ns
    if checkpoint_id:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def ids_of(tuples: list[dict[str, Any]]) -> list[str]:
    return [t["config"]["configurable"]["checkpoint_id"] for t in tuples]


def states_pages(calls: list[list[Any]]) -> list[tuple[int, int]]:
    """(start_version, page_size) of each page of history read with states."""
    return [(start, size) for method, size, start, states in calls if method == "ListVersions" and states]


def test_node_list_reads_pages_with_states_not_a_get_per_checkpoint(sidecar: Sidecar) -> None:
    written = run_node(_WRITE, sidecar, str(STEPS), str(CHILD_STEPS), RUN_DELETED)
    root, d = written["root"], written["d"]
    with CkptSaver(sidecar.unix_target, serde=JsonSerde()) as python_saver:
        # The Python saver's delete: d's newest 5 hidden by its head, its newest survivor restated.
        python_saver.delete_for_runs([RUN_DELETED])
    cases = {
        "all": {"config": thread("t"), "options": {}},
        "limit": {"config": thread("t"), "options": {"limit": 3}},
        "before": {"config": thread("t"), "options": {"before": thread("t", checkpoint_id=root[10]), "limit": 4}},
        "one": {"config": thread("t", checkpoint_id=root[7]), "options": {}},
        "filter": {"config": thread("t"), "options": {"filter": {"step": 1}, "limit": 2}},
        "stopped": {"config": thread("t"), "options": {}, "stopAfter": 1},
        "namespaces": {"config": thread("t", None), "options": {}},
        "deleted": {"config": thread("d"), "options": {}},
    }
    out = run_node(_LIST, sidecar, json.dumps(cases))

    for name, case in out.items():
        # The same checkpoints as one getTuple each, pending writes and all; a Get for the head's
        # deleted ids per namespace, not one per checkpoint.
        assert case["listed"] == case["one"], name
        gets = [c for c in case["calls"] if c[0] == "Get"]
        assert len(gets) == (2 if name == "namespaces" else 1), (name, case["calls"])

    assert ids_of(out["all"]["listed"]) == root
    assert [t["metadata"]["step"] for t in out["all"]["listed"]] == list(range(STEPS - 1, -1, -1))
    assert [t["pendingWrites"] for t in out["all"]["listed"][:2]] == [
        [["task-29", "n", "write of 29"]],
        [["task-28", "n", "write of 28"]],
    ]
    assert out["all"]["listed"][1]["checkpoint"]["channel_values"]["log"] == [f"entry {i}" for i in range(3)]
    assert states_pages(out["all"]["calls"]) == [(STEPS, STEPS)]  # one page, from the head down
    # The namespace's labels in one page, then its states in another: two ListVersions in all.
    assert [c[0] for c in out["all"]["calls"]].count("ListVersions") == 2

    assert ids_of(out["limit"]["listed"]) == root[:3]
    assert states_pages(out["limit"]["calls"]) == [(STEPS, 3)]
    # Nothing newer than `before`: the page starts at the version below it and ends at the limit.
    assert ids_of(out["before"]["listed"]) == root[11:15]
    assert states_pages(out["before"]["calls"]) == [(STEPS - 11, 4)]
    assert ids_of(out["one"]["listed"]) == [root[7]]
    assert states_pages(out["one"]["calls"]) == [(STEPS - 7, 1)]
    # A filter the labels cannot answer: pages grow, twice the last, until the limit is met or none is left.
    assert ids_of(out["filter"]["listed"]) == [root[-2]]
    assert states_pages(out["filter"]["calls"]) == [(30, 2), (28, 4), (24, 8), (16, 16)]
    # A caller that stops reads no further page.
    assert ids_of(out["stopped"]["listed"]) == root[:1]
    assert len(states_pages(out["stopped"]["calls"])) == 1

    # Every namespace of the thread: each one's newest first, a page of states each.
    listed = out["namespaces"]["listed"]
    by_ns = [t["config"]["configurable"]["checkpoint_ns"] for t in listed]
    assert sorted(by_ns) == sorted([""] * STEPS + ["child"] * CHILD_STEPS)
    assert ids_of([t for t in listed if t["config"]["configurable"]["checkpoint_ns"] == ""]) == root
    assert len(states_pages(out["namespaces"]["calls"])) == 2

    # Deleted checkpoints are not listed, and a restated one is listed once, at its newest version (the
    # restating one, above the versions it hid).
    assert ids_of(out["deleted"]["listed"]) == d[5:]
    assert states_pages(out["deleted"]["calls"]) == [(STEPS + 1, STEPS + 1)]
