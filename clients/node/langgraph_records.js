// The records of the LangGraph.js saver (langgraph.js), as
// proto/ckpt/langgraph/v1/records.proto lays them out for both savers: a
// thread's checkpoint namespace is a session, a checkpoint one Step version,
// pending writes "langgraph.writes" events after the checkpoint's
// "langgraph.checkpoint" marker.
'use strict';

const path = require('path');
const protobuf = require('protobufjs');
const { compareWritesSortKeys, writesSortKey } = require('@langchain/langgraph-checkpoint');

// The file's name as protoc (the Python saver) registers it: one file defines the type for both.
const RECORDS_FILE = 'ckpt/langgraph/v1/records.proto';
const STEP_TYPE = 'ckpt.langgraph.v1.Step';
const CHECKPOINT_EVENT = 'langgraph.checkpoint';
const WRITES_EVENT = 'langgraph.writes';
const THREAD_LABEL = 'langgraph.thread';
const ID_LABEL = 'langgraph.id';
const RUN_LABEL = 'langgraph.run';
// The sidecar's limits: a label value, a session id (service.proto).
const MAX_LABEL_BYTES = 128;
const MAX_SESSION_ID_BYTES = 256;
const EMPTY = 'empty';

let root = null;

// The records' protobufjs Root, field names as in the .proto (the field mask names them so).
function records() {
  if (root === null) {
    const loaded = new protobuf.Root();
    loaded.loadSync(path.resolve(__dirname, '..', '..', 'proto', RECORDS_FILE), { keepCase: true });
    loaded.resolveAll();
    root = loaded;
  }
  return root;
}

const Step = () => records().lookupType(STEP_TYPE);
const Writes = () => records().lookupType('ckpt.langgraph.v1.Writes');

const utf8Bytes = (s) => Buffer.byteLength(s, 'utf8');

// The session of (threadId, checkpointNs): the thread id's length, in code points as Python's len()
// counts them, lets a thread id hold '/'.
function sessionIdOf(threadId, checkpointNs) {
  if (utf8Bytes(threadId) > MAX_LABEL_BYTES) {
    throw new RangeError(
      `thread_id is ${utf8Bytes(threadId)} bytes of UTF-8; ckpt's LangGraph saver takes at most ${MAX_LABEL_BYTES} (a label's limit)`,
    );
  }
  const id = `langgraph/${[...threadId].length}/${threadId}/${checkpointNs}`;
  if (utf8Bytes(id) > MAX_SESSION_ID_BYTES) {
    throw new RangeError(
      `thread_id and checkpoint_ns make a session id of ${utf8Bytes(id)} bytes; the sidecar takes at most ${MAX_SESSION_ID_BYTES}`,
    );
  }
  return id;
}

// { threadId, checkpointNs } of a saver's session id, null for any other session.
function parseSessionId(sessionId) {
  const m = /^langgraph\/(\d+)\//.exec(sessionId);
  if (m === null) return null;
  const chars = [...sessionId.slice(m[0].length)];
  const n = Number(m[1]);
  if (chars.length < n + 1 || chars[n] !== '/') return null;
  return { threadId: chars.slice(0, n).join(''), checkpointNs: chars.slice(n + 1).join('') };
}

// A serde's [type, bytes] as a Typed, and back.
const typed = ([type, data]) => ({ type, data: typeof data === 'string' ? Buffer.from(data, 'utf8') : data });
const emptyTyped = () => ({ type: EMPTY, data: Buffer.alloc(0) });
// A copy: the decoded bytes are a view of the whole message's buffer.
const bytesOf = (t) => new Uint8Array(t.data || []);

function encodeStep(step) {
  const type = Step();
  return Buffer.from(type.encode(type.fromObject(step)).finish());
}

function decodeStep(bytes) {
  const type = Step();
  return type.toObject(type.decode(bytes), { defaults: true, arrays: true, objects: true });
}

function encodeWrites(writes) {
  const type = Writes();
  return Buffer.from(type.encode(type.fromObject(writes)).finish());
}

function decodeWrites(bytes) {
  const type = Writes();
  return type.toObject(type.decode(bytes), { defaults: true, arrays: true, longs: Number });
}

// One checkpoint's pending writes from its Writes records in log order: for a (task, idx) the first
// write wins, except for LangGraph's special channels (negative idx), where the last does; returned in
// writesSortKey order, as LangGraph applies them.
function foldWrites(recordsInOrder) {
  const byKey = new Map();
  for (const record of recordsInOrder) {
    for (const w of record.writes) {
      const key = JSON.stringify([record.task_id, w.idx]);
      if (w.idx >= 0 && byKey.has(key)) continue;
      byKey.set(key, { taskId: record.task_id, taskPath: record.task_path, idx: w.idx, channel: w.channel, value: w.value });
    }
  }
  const folded = [...byKey.values()].map((w) => ({ ...w, key: writesSortKey(w.taskPath, w.taskId, w.idx) }));
  folded.sort((a, b) => compareWritesSortKeys(a.key, b.key));
  return folded;
}

// The pending writes of a session's checkpoints, read from its log newest first as far as needed and
// kept: writesOf(id) returns a checkpoint's folded writes once its marker was read (every write of a
// checkpoint comes after its marker).
class LogReader {
  constructor(client, sessionId) {
    this.events = client.events(sessionId, { types: [WRITES_EVENT, CHECKPOINT_EVENT], newestFirst: true, pageSize: 1000 });
    this.byCheckpoint = new Map(); // id -> [{ seq, record }]
    this.marked = new Set();
    this.done = false;
  }

  async writesOf(checkpointId) {
    while (!this.marked.has(checkpointId) && !this.done) {
      let next;
      try {
        next = await this.events.next();
      } catch (err) {
        if (err.code !== 5) throw err; // NOT_FOUND: the thread was deleted meanwhile
        next = { done: true };
      }
      if (next.done) {
        this.done = true;
        break;
      }
      const event = next.value;
      if (event.type === CHECKPOINT_EVENT) {
        this.marked.add(Buffer.from(event.payload).toString('utf8'));
      } else {
        const record = decodeWrites(event.payload);
        const list = this.byCheckpoint.get(record.checkpoint_id) || [];
        list.push({ seq: event.seq, record });
        this.byCheckpoint.set(record.checkpoint_id, list);
      }
    }
    const found = (this.byCheckpoint.get(checkpointId) || []).slice().sort((a, b) => a.seq - b.seq);
    return foldWrites(found.map((f) => f.record));
  }

  close() {
    this.events.return().catch(() => {});
  }
}

module.exports = {
  CHECKPOINT_EVENT,
  EMPTY,
  ID_LABEL,
  LogReader,
  MAX_LABEL_BYTES,
  RECORDS_FILE,
  RUN_LABEL,
  STEP_TYPE,
  THREAD_LABEL,
  WRITES_EVENT,
  bytesOf,
  decodeStep,
  emptyTyped,
  encodeStep,
  encodeWrites,
  foldWrites,
  parseSessionId,
  records,
  sessionIdOf,
  typed,
  utf8Bytes,
};
