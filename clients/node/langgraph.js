// A LangGraph.js checkpointer on the ckpt sidecar: `new CkptSaver('unix:data/ckpt.sock')`, passed to
// `graph.compile({ checkpointer })`. It lays checkpoints out as the Python saver does
// (proto/ckpt/langgraph/v1/records.proto), so either reads what the other wrote when both use the
// same serializer: a thread's namespace is one session, a checkpoint one typed Step version, written
// as a MERGE patch of what changed when it continues the head this saver last saw, compare-and-set
// on that head so that two writers never fork a thread silently.
'use strict';

const { status } = require('@grpc/grpc-js');
const { BaseCheckpointSaver, TASKS, WRITES_IDX_MAP, getCheckpointId, maxChannelVersion } = require('@langchain/langgraph-checkpoint');
const { isDeepStrictEqual } = require('util');
const { CheckpointClient, ConflictError } = require('./ckpt_client');
const r = require('./langgraph_records');

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

const isNotFound = (err) => err && err.code === status.NOT_FOUND;

// thread_id, checkpoint_ns and checkpoint_id of a config: thread_id undefined when it has none.
function threadOf(config) {
  const configurable = (config && config.configurable) || {};
  const threadId = configurable.thread_id;
  const checkpointNs = configurable.checkpoint_ns ?? '';
  if (typeof checkpointNs !== 'string') throw new TypeError(`checkpoint_ns must be a string, not ${typeof checkpointNs}`);
  if (threadId === undefined || threadId === null) return { threadId: undefined, checkpointNs };
  if (typeof threadId !== 'string' && typeof threadId !== 'number') {
    throw new TypeError(`thread_id must be a string, not ${typeof threadId}`);
  }
  return { threadId: String(threadId), checkpointNs, checkpointId: getCheckpointId(config) || undefined };
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

class CkptSaver extends BaseCheckpointSaver {
  // target: a sidecar ('unix:/path/ckpt.sock', 'localhost:50051'), or a CheckpointClient to use (then
  // close() leaves it open). serde: LangGraph's serializer (default JsonPlusSerializer); the other
  // options are CheckpointClient's (timeoutMs, retries, tls, maxMessageBytes).
  constructor(target, { serde, ...clientOptions } = {}) {
    super(serde);
    if (target instanceof CheckpointClient) {
      this.client = target;
      this.ownsClient = false;
    } else if (typeof target === 'string') {
      this.client = new CheckpointClient(target, clientOptions);
      this.ownsClient = true;
    } else {
      throw new TypeError('target must be a sidecar address string or a CheckpointClient');
    }
    // session id -> { version, checkpointId }: the head this saver last read or wrote; version 0 and
    // checkpointId '' when it found the namespace without any checkpoint.
    this.heads = new Map();
    this.registered = null;
  }

  static fromConnString(target, options) {
    return new CkptSaver(target, options);
  }

  // Registers the Step type once per saver (a no-op on the sidecar once any client did).
  registerStep() {
    if (this.registered === null) {
      this.registered = this.client.registerType(r.records(), r.STEP_TYPE, { fileName: r.RECORDS_FILE });
      this.registered.catch(() => {
        this.registered = null;
      });
    }
    return this.registered;
  }

  async getTuple(config) {
    const { threadId, checkpointNs, checkpointId } = threadOf(config);
    if (threadId === undefined) return undefined;
    const sessionId = r.sessionIdOf(threadId, checkpointNs);
    let found;
    if (checkpointId === undefined) {
      found = await this.latest(sessionId);
    } else {
      found = await this.locate(sessionId, checkpointId);
    }
    if (found === undefined) return undefined;
    if (found.isHead) this.heads.set(sessionId, { version: found.version, checkpointId: found.step.checkpoint_id });
    else if (found.absent) this.heads.set(sessionId, { version: 0, checkpointId: '' });
    if (found.step === undefined) return undefined;
    const log = new r.LogReader(this.client, sessionId);
    try {
      return await this.tupleOf(threadId, checkpointNs, found.step, log);
    } finally {
      log.close();
    }
  }

  // The newest checkpoint of a session not deleted: { version, step, isHead }, { absent: true } when
  // the session does not exist, or undefined.
  async latest(sessionId) {
    const head = await this.read(sessionId, 0);
    if (head === undefined) return { absent: true };
    const deleted = new Set(head.step.deleted_checkpoint_ids);
    if (!deleted.has(head.step.checkpoint_id)) return { ...head, isHead: true };
    for await (const info of this.versions(sessionId)) {
      const id = info.labels[r.ID_LABEL];
      if (id !== undefined && !deleted.has(id)) return this.read(sessionId, info.version);
    }
    return undefined;
  }

  // The version holding `checkpointId`: { version, step, isHead }, or undefined.
  async locate(sessionId, checkpointId) {
    let headVersion = null;
    for await (const info of this.versions(sessionId)) {
      if (headVersion === null) headVersion = info.version;
      if (info.labels[r.ID_LABEL] !== checkpointId) continue;
      const found = await this.read(sessionId, info.version);
      if (found === undefined) return undefined;
      const deleted = info.version === headVersion ? found.step.deleted_checkpoint_ids : await this.deletedIds(sessionId);
      if (deleted.includes(checkpointId)) return undefined;
      return { ...found, isHead: info.version === headVersion };
    }
    return undefined;
  }

  // A session's versions, newest first, a page at a time; none if it does not exist.
  async *versions(sessionId) {
    let token = '';
    do {
      let page;
      try {
        page = await this.client.call('ListVersions', { session_id: sessionId, page_size: 100, page_token: token });
      } catch (err) {
        if (isNotFound(err)) return;
        throw err;
      }
      yield* page.versions;
      token = page.next_page_token;
    } while (token);
  }

  // { version, step } of a session's version (0: the head), or undefined if there is none.
  async read(sessionId, version) {
    try {
      const got = await this.client.get(sessionId, version);
      return { version: got.version, step: r.decodeStep(got.state) };
    } catch (err) {
      if (isNotFound(err)) return undefined;
      throw err;
    }
  }

  // The checkpoints removed from a session (by the Python saver's delete_for_runs): its head's list.
  async deletedIds(sessionId) {
    try {
      const got = await this.client.get(sessionId, 0, { fieldMask: ['deleted_checkpoint_ids'] });
      return r.decodeStep(got.state).deleted_checkpoint_ids;
    } catch (err) {
      if (isNotFound(err)) return [];
      throw err;
    }
  }

  async tupleOf(threadId, checkpointNs, step, log) {
    const checkpoint = await this.serde.loadsTyped(step.checkpoint.type, r.bytesOf(step.checkpoint));
    const channelValues = {};
    for (const channel of Object.keys(checkpoint.channel_versions || {})) {
      const value = step.channels[channel];
      if (value === undefined || value.type === r.EMPTY) continue;
      channelValues[channel] = await this.serde.loadsTyped(value.type, r.bytesOf(value));
    }
    checkpoint.channel_values = channelValues;
    const parentId = step.parent_checkpoint_id || undefined;
    if (checkpoint.v < 4 && parentId !== undefined) await this.migratePendingSends(checkpoint, parentId, log);
    const pendingWrites = await Promise.all(
      (await log.writesOf(step.checkpoint_id)).map(async (w) => [
        w.taskId,
        w.channel,
        await this.serde.loadsTyped(w.value.type, r.bytesOf(w.value)),
      ]),
    );
    const tuple = {
      config: configOf(threadId, checkpointNs, step.checkpoint_id),
      checkpoint,
      metadata: await this.serde.loadsTyped(step.metadata.type, r.bytesOf(step.metadata)),
      pendingWrites,
    };
    if (parentId !== undefined) tuple.parentConfig = configOf(threadId, checkpointNs, parentId);
    return tuple;
  }

  // Checkpoints before format 4 kept the sends of a step as the parent's TASKS writes; LangGraph now
  // reads them from the TASKS channel.
  async migratePendingSends(checkpoint, parentId, log) {
    const sends = (await log.writesOf(parentId)).filter((w) => w.channel === TASKS);
    checkpoint.channel_values[TASKS] = await Promise.all(
      sends.map((w) => this.serde.loadsTyped(w.value.type, r.bytesOf(w.value))),
    );
    const versions = Object.values(checkpoint.channel_versions);
    checkpoint.channel_versions[TASKS] = versions.length > 0 ? maxChannelVersion(...versions) : this.getNextVersion(undefined);
  }

  // Checkpoints newest first per session: of `config`'s thread (all threads without one) and
  // namespace (all without one), with an id before `before`'s, metadata matching `filter` key by key,
  // at most `limit`.
  async *list(config, options = {}) {
    const { before, limit, filter } = options;
    const { threadId, checkpointId } = threadOf(config);
    const namespace = config && config.configurable && config.configurable.checkpoint_ns;
    const beforeId = before ? getCheckpointId(before) || undefined : undefined;
    let left = limit;
    for await (const session of this.sessionsOf(threadId, namespace)) {
      const deleted = new Set();
      const log = new r.LogReader(this.client, session.sessionId);
      try {
        let first = true;
        for await (const info of this.versions(session.sessionId)) {
          const id = info.labels[r.ID_LABEL];
          if (first) {
            for (const d of await this.deletedIds(session.sessionId)) deleted.add(d);
            first = false;
          }
          if (id === undefined || deleted.has(id)) continue;
          if (checkpointId !== undefined && id !== checkpointId) continue;
          if (beforeId !== undefined && !(id < beforeId)) continue;
          const found = await this.read(session.sessionId, info.version);
          if (found === undefined) break; // the thread was deleted meanwhile
          if (filter && Object.keys(filter).length > 0) {
            const metadata = await this.serde.loadsTyped(found.step.metadata.type, r.bytesOf(found.step.metadata));
            if (!Object.entries(filter).every(([k, v]) => isDeepStrictEqual(metadata[k], v))) continue;
          }
          if (left !== undefined) {
            if (left <= 0) return;
            left -= 1;
          }
          yield await this.tupleOf(session.threadId, session.checkpointNs, found.step, log);
        }
      } finally {
        log.close();
      }
    }
  }

  // { sessionId, threadId, checkpointNs } of the saver's sessions of a thread (every thread when
  // undefined) and namespace (every one when undefined).
  async *sessionsOf(threadId, checkpointNs) {
    if (threadId !== undefined && checkpointNs !== undefined) {
      yield { sessionId: r.sessionIdOf(threadId, checkpointNs), threadId, checkpointNs };
      return;
    }
    const labels = threadId === undefined ? {} : { [r.THREAD_LABEL]: threadId };
    for await (const info of this.client.sessions({ labels })) {
      const parsed = r.parseSessionId(info.session_id);
      if (parsed === null || !(r.THREAD_LABEL in info.labels)) continue;
      if (threadId !== undefined && parsed.threadId !== threadId) continue;
      if (checkpointNs !== undefined && parsed.checkpointNs !== checkpointNs) continue;
      yield { sessionId: info.session_id, ...parsed };
    }
  }

  async put(config, checkpoint, metadata, newVersions) {
    const { threadId, checkpointNs, checkpointId: parentId } = requireThread(config, 'put');
    const sessionId = r.sessionIdOf(threadId, checkpointNs);
    const registering = this.registerStep();
    const { channel_values: values = {}, ...rest } = checkpoint;
    const channels = {};
    for (const channel of Object.keys(newVersions || {})) {
      channels[channel] = Object.prototype.hasOwnProperty.call(values, channel)
        ? r.typed(await this.serde.dumpsTyped(values[channel]))
        : r.emptyTyped();
    }
    const step = {
      checkpoint_id: checkpoint.id,
      parent_checkpoint_id: parentId || '',
      checkpoint: r.typed(await this.serde.dumpsTyped(rest)),
      metadata: r.typed(await this.serde.dumpsTyped(metadata)),
      channels,
    };
    const seen = this.heads.get(sessionId);
    // The first checkpoint of a namespace this saver found empty continues that empty head too: a
    // compare-and-set on version 0 keeps a second writer from starting the same thread beside it.
    const continues = seen !== undefined && (parentId || '') === seen.checkpointId;
    if (!continues) await this.wholeStep(sessionId, step, checkpoint);
    const labels = { [r.THREAD_LABEL]: threadId, [r.ID_LABEL]: checkpoint.id };
    const runId = metadata && metadata.run_id;
    if (typeof runId === 'string' && runId && r.utf8Bytes(runId) <= r.MAX_LABEL_BYTES) labels[r.RUN_LABEL] = runId;
    await registering;
    let reply;
    try {
      reply = await this.client.appendEvents(sessionId, [{ type: r.CHECKPOINT_EVENT, payload: checkpoint.id }], {
        put: {
          state: r.encodeStep(step),
          merge: continues && seen.version > 0,
          expectedVersion: continues ? seen.version : undefined,
          labels,
          messageType: r.STEP_TYPE,
        },
      });
    } catch (err) {
      if (err instanceof ConflictError) {
        const read = seen.version ? `checkpoint ${parentId} (version ${seen.version})` : 'it without checkpoints';
        throw new CheckpointConflictError(
          `thread ${JSON.stringify(threadId)} (checkpoint_ns ${JSON.stringify(checkpointNs)}) moved on since this saver read` +
            ` ${read}; the head is version ${err.currentVersion}: another writer wrote it; run the thread again to` +
            ' resume from its new head',
          { threadId, checkpointNs, currentVersion: err.currentVersion },
        );
      }
      throw err;
    }
    this.heads.set(sessionId, { version: reply.put.version, checkpointId: checkpoint.id });
    return configOf(threadId, checkpointNs, checkpoint.id);
  }

  // A step that does not continue the head is written whole (REPLACE): the channels it did not
  // change come from its parent, and the checkpoints deleted from the session stay deleted.
  async wholeStep(sessionId, step, checkpoint) {
    const parentId = step.parent_checkpoint_id;
    const parent = parentId ? await this.locate(sessionId, parentId) : undefined;
    if (parent !== undefined) {
      for (const channel of Object.keys(checkpoint.channel_versions || {})) {
        const value = parent.step.channels[channel];
        if (!(channel in step.channels) && value !== undefined && value.type !== r.EMPTY) step.channels[channel] = value;
      }
    }
    step.deleted_checkpoint_ids = await this.deletedIds(sessionId);
  }

  async putWrites(config, writes, taskId, taskPath = '') {
    const { threadId, checkpointNs, checkpointId } = requireThread(config, 'putWrites');
    if (checkpointId === undefined) {
      throw new Error('putWrites: the config\'s configurable has no checkpoint_id: writes belong to a checkpoint');
    }
    const sessionId = r.sessionIdOf(threadId, checkpointNs);
    const record = {
      checkpoint_id: checkpointId,
      task_id: taskId,
      task_path: taskPath || '',
      writes: await Promise.all(
        writes.map(async ([channel, value], i) => ({
          idx: WRITES_IDX_MAP[channel] ?? i,
          channel,
          value: r.typed(await this.serde.dumpsTyped(value)),
        })),
      ),
    };
    await this.client.appendEvents(sessionId, [{ type: r.WRITES_EVENT, payload: r.encodeWrites(record) }]);
  }

  // Removes every namespace of the thread: its checkpoints and writes.
  async deleteThread(threadId) {
    const id = String(threadId);
    const sessions = [];
    for await (const s of this.sessionsOf(id, undefined)) sessions.push(s.sessionId);
    for (const sessionId of sessions) {
      this.heads.delete(sessionId);
      try {
        await this.client.delete(sessionId);
      } catch (err) {
        if (!isNotFound(err)) throw err;
      }
    }
  }

  // Closes the client this saver made (not one it was given).
  close() {
    if (this.ownsClient) this.client.close();
  }
}

module.exports = { CheckpointConflictError, CkptSaver };
