// The thread of a LangGraph.js config, and the error the saver (langgraph.js) throws when another writer
// moved it on.
'use strict';

const { getCheckpointId } = require('@langchain/langgraph-checkpoint');

// What put throws when another writer moved the thread's head since this saver read it: the graph's
// run fails with it, and running the thread again resumes from the new head.
class CheckpointConflictError extends Error {
  constructor(message, { threadId, checkpointNs, currentVersion }) {
    super(message);
    this.name = 'CheckpointConflictError';
    this.threadId = threadId;
    this.checkpointNs = checkpointNs;
    this.currentVersion = currentVersion;
  }
}

// Why a put lost to another writer: `read`, what of the thread the saver read before.
function conflictError({ threadId, checkpointNs }, read, currentVersion) {
  return new CheckpointConflictError(
    `thread ${JSON.stringify(threadId)} (checkpoint_ns ${JSON.stringify(checkpointNs)}) moved on since this saver read` +
      ` ${read}; the head is version ${currentVersion}: another writer wrote it; run the thread again to` +
      ' resume from its new head',
    { threadId, checkpointNs, currentVersion },
  );
}

// A thread id as the saver stores it: a string, or a number as its decimal string; anything else (and a
// string holding a lone surrogate, which is not text) a TypeError naming `name`.
function threadIdOf(threadId, name = 'thread_id') {
  if (typeof threadId !== 'string' && typeof threadId !== 'number') {
    throw new TypeError(`${name} must be a string, not ${threadId === null ? 'null' : typeof threadId}`);
  }
  return text(name, String(threadId));
}

function text(name, value) {
  if (!value.isWellFormed()) throw new TypeError(`${name} holds a lone surrogate, which is not text: ckpt's savers cannot store it`);
  return value;
}

// thread_id, checkpoint_ns and checkpoint_id of a config: thread_id undefined when it has none.
function threadOf(config) {
  const configurable = (config && config.configurable) || {};
  const threadId = configurable.thread_id;
  const checkpointNs = configurable.checkpoint_ns ?? '';
  if (typeof checkpointNs !== 'string') throw new TypeError(`checkpoint_ns must be a string, not ${typeof checkpointNs}`);
  text('checkpoint_ns', checkpointNs);
  const checkpointId = (config && getCheckpointId(config)) || undefined;
  if (threadId === undefined || threadId === null) return { threadId: undefined, checkpointNs, checkpointId };
  return { threadId: threadIdOf(threadId), checkpointNs, checkpointId };
}

function requireThread(config, what) {
  const t = threadOf(config);
  if (t.threadId === undefined) {
    throw new Error(
      `${what}: the config's configurable has no thread_id; pass one: graph.invoke(input, { configurable: { thread_id: 'my-thread' } })`,
    );
  }
  return t;
}

const configOf = (threadId, checkpointNs, checkpointId) => ({
  configurable: { thread_id: threadId, checkpoint_ns: checkpointNs, checkpoint_id: checkpointId },
});

module.exports = { CheckpointConflictError, configOf, conflictError, requireThread, threadIdOf, threadOf };
