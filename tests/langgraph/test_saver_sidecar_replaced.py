"""A saver whose sidecar is replaced by one on a new, empty data directory (a container restarted without its
volume): the checkpoints are gone with the old directory, but the saver goes on writing to the new one, its
record type registered again, instead of failing every put until it is made anew."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from ckpt.sidecar.langgraph import AsyncCkptSaver, CkptSaver
from tests.langgraph.test_node_saver import node_process
from tests.langgraph.test_saver_sidecar import got, put, thread
from tests.support import start_sidecar


def test_a_saver_goes_on_writing_to_a_sidecar_restarted_on_an_empty_store(tmp_path: Path) -> None:
    socket_path = tmp_path / "ckpt.sock"
    first = start_sidecar(tmp_path / "first", socket_path=socket_path)
    with CkptSaver(f"unix:{socket_path}", retries=5, timeout_seconds=10) as saver:
        try:
            put(saver, thread("t"), {"messages": ["before"]}, 0)
        finally:
            assert first.stop() == 0, first.log()
        second = start_sidecar(tmp_path / "second", socket_path=socket_path)
        try:
            assert saver.get_tuple(thread("t")) is None  # the old store's checkpoints went with it
            put(saver, thread("u"), {"messages": ["after"]}, 0)
            assert got(saver, thread("u")).checkpoint["channel_values"] == {"messages": ["after"]}
            put(saver, thread("t"), {"messages": ["again"]}, 0)
            assert got(saver, thread("t")).checkpoint["channel_values"] == {"messages": ["again"]}
        finally:
            assert second.stop() == 0, second.log()


def test_an_async_saver_goes_on_writing_to_a_sidecar_restarted_on_an_empty_store(tmp_path: Path) -> None:
    socket_path = tmp_path / "ckpt.sock"

    async def main() -> None:
        first = await asyncio.to_thread(start_sidecar, tmp_path / "first", socket_path=socket_path)
        async with AsyncCkptSaver(f"unix:{socket_path}", retries=5, timeout_seconds=10) as saver:
            try:
                await asyncio.to_thread(put, saver, thread("t"), {"messages": ["before"]}, 0)
            finally:
                assert await asyncio.to_thread(first.stop) == 0, first.log()
            second = await asyncio.to_thread(start_sidecar, tmp_path / "second", socket_path=socket_path)
            try:
                assert await saver.aget_tuple(thread("t")) is None
                await asyncio.to_thread(put, saver, thread("u"), {"messages": ["after"]}, 0)
                found = await saver.aget_tuple(thread("u"))
                assert found is not None and found.checkpoint["channel_values"] == {"messages": ["after"]}
            finally:
                assert await asyncio.to_thread(second.stop) == 0, second.log()

    asyncio.run(main())


# The LangGraph.js saver: puts thread "t", says "put" and waits for a line (the test replaces the sidecar);
# then puts threads "u" and "t" and prints what getTuple reads of each.
_JS = r"""
const readline = require('readline');
const { emptyCheckpoint, uuid6 } = require(process.argv[1] + '/node_modules/@langchain/langgraph-checkpoint');
const { CkptSaver } = require(process.argv[1] + '/langgraph.js');
const [target] = process.argv.slice(2);
const thread = (id) => ({ configurable: { thread_id: id, checkpoint_ns: '' } });
const put = (saver, id, messages) => {
  const values = { channel_values: { messages }, channel_versions: { messages: 1 } };
  const checkpoint = { ...emptyCheckpoint(), id: uuid6(-1), ...values };
  return saver.put(thread(id), checkpoint, { source: 'loop', step: 0, parents: {} }, { messages: 1 });
};
(async () => {
  const lines = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();
  const saver = new CkptSaver(target, { retries: 5, timeoutMs: 10000 });
  await put(saver, 't', ['before']);
  console.log('put');
  await lines.next();
  const out = { gone: (await saver.getTuple(thread('t'))) === undefined };
  await put(saver, 'u', ['after']);
  await put(saver, 't', ['again']);
  for (const id of ['u', 't']) out[id] = (await saver.getTuple(thread(id))).checkpoint.channel_values.messages;
  console.log(JSON.stringify(out));
  saver.close();
  process.exit(0);
})().catch((err) => { console.error(err); process.exit(1); });
"""


def test_a_js_saver_goes_on_writing_to_a_sidecar_restarted_on_an_empty_store(tmp_path: Path) -> None:
    socket_path = tmp_path / "ckpt.sock"
    first = start_sidecar(tmp_path / "first", socket_path=socket_path)
    node = node_process(_JS, f"unix:{socket_path}")
    try:
        assert node.stdout is not None and node.stdin is not None
        assert node.stdout.readline() == "put\n", node.stderr.read() if node.stderr else ""
        assert first.stop() == 0, first.log()
        second = start_sidecar(tmp_path / "second", socket_path=socket_path)
        try:
            out, err = node.communicate("go\n", timeout=60)
            assert node.returncode == 0, err
            assert json.loads(out) == {"gone": True, "u": ["after"], "t": ["again"]}
        finally:
            assert second.stop() == 0, second.log()
    finally:
        if node.poll() is None:
            node.kill()
        node.wait()
        if first.process.poll() is None:
            first.stop()
