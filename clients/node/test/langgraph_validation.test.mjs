// LangGraph's conformance suite for checkpointers, run by vitest against the sidecar at CKPT_TARGET
// (tests/client/test_node_langgraph.py starts one and reads the results).
import { createRequire } from 'node:module';
import { deltaChannelHistoryTests, specTest } from '@langchain/langgraph-checkpoint-validation';

const require = createRequire(import.meta.url);
const { CkptSaver } = require('../langgraph.js');
const { CheckpointClient } = require('../ckpt_client.js');

const target = process.env.CKPT_TARGET;
if (!target) throw new Error('CKPT_TARGET must name the sidecar to test against');

// The suite wants each checkpointer to see only what it wrote: one sidecar serves them all, so each
// starts with the saver's sessions of the ones before removed.
async function removeSaverSessions() {
  const client = new CheckpointClient(target);
  try {
    const ids = [];
    for await (const s of client.sessions()) if (s.session_id.startsWith('langgraph/')) ids.push(s.session_id);
    for (const id of ids) await client.delete(id);
  } finally {
    client.close();
  }
}

const initializer = {
  checkpointerName: 'ckpt CkptSaver',
  async createCheckpointer() {
    await removeSaverSessions();
    return new CkptSaver(target);
  },
  destroyCheckpointer(saver) {
    saver.close();
  },
};

specTest(initializer);
describe('opt-in suites', () => {
  deltaChannelHistoryTests(initializer);
});
