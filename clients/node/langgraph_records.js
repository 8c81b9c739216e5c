// The records of the LangGraph.js saver (langgraph.js), as
// proto/ckpt/langgraph/v1/records.proto lays them out for both savers: a
// thread's checkpoint namespace is a session, a checkpoint one Step version
// (list channels element by element in its items), pending writes
// "langgraph.writes" events after the Step's writes_after_seq.
'use strict';

const path = require('path');
const protobuf = require('protobufjs');
const { xxh3 } = require('@node-rs/xxhash');
const { compareWritesSortKeys, writesSortKey } = require('@langchain/langgraph-checkpoint');
const { PROTO_ROOT } = require('./proto_root');

// The file's name as protoc (the Python saver) registers it: one file defines the type for both.
const RECORDS_FILE = 'ckpt/langgraph/v1/records.proto';
const STEP_TYPE = 'ckpt.langgraph.v1.Step';
const WRITES_EVENT = 'langgraph.writes';
const THREAD_LABEL = 'langgraph.thread';
const ID_LABEL = 'langgraph.id';
const RUN_LABEL = 'langgraph.run';
// The sidecar's limits: a label value, a session id (service.proto).
const MAX_LABEL_BYTES = 128;
const MAX_SESSION_ID_BYTES = 256;
const EMPTY = 'empty';
// A list channel's type: its elements are in Step.items.
const ITEMS = 'ckpt.items';

let root = null;

// The records' protobufjs Root, field names as in the .proto (the field mask names them so).
function records() {
  if (root === null) {
    const loaded = new protobuf.Root();
    loaded.loadSync(path.join(PROTO_ROOT, RECORDS_FILE), { keepCase: true });
    loaded.resolveAll();
    root = loaded;
  }
  return root;
}

const Step = () => records().lookupType(STEP_TYPE);
const Writes = () => records().lookupType('ckpt.langgraph.v1.Writes');

const utf8Bytes = (s) => Buffer.byteLength(s, 'utf8');
// What ids may not hold (ckpt/sidecar/ids.py): refused here naming the saver's own field.
const CONTROL = /[\x00-\x1f\x7f]/;

// The session of (threadId, checkpointNs): the thread id's length, in code points as Python's len()
// counts them, lets a thread id hold '/'. An id it cannot store is a RangeError naming `threadField` (the
// caller's name for the thread id) or checkpoint_ns.
function sessionIdOf(threadId, checkpointNs, threadField = 'thread_id') {
  for (const [field, value] of [[threadField, threadId], ['checkpoint_ns', checkpointNs]]) {
    if (CONTROL.test(value)) {
      throw new RangeError(
        `${field} ${JSON.stringify(value)} contains an ASCII control character (U+0000-U+001F or U+007F): ckpt's savers cannot store it`,
      );
    }
  }
  if (utf8Bytes(threadId) > MAX_LABEL_BYTES) {
    throw new RangeError(
      `${threadField} is ${utf8Bytes(threadId)} bytes of UTF-8; ckpt's LangGraph saver takes at most ${MAX_LABEL_BYTES} (a label's limit)`,
    );
  }
  const prefix = threadPrefix(threadId);
  const overhead = utf8Bytes(prefix) - utf8Bytes(threadId);
  const size = utf8Bytes(threadId) + utf8Bytes(checkpointNs);
  if (size + overhead > MAX_SESSION_ID_BYTES) {
    throw new RangeError(
      `${threadField} and checkpoint_ns are ${size} bytes of UTF-8 together; ckpt's savers take at most` +
        ` ${MAX_SESSION_ID_BYTES - overhead} (${MAX_SESSION_ID_BYTES}, a session id's limit, less the ${overhead} bytes they are stored with)`,
    );
  }
  return `${prefix}${checkpointNs}`;
}

// What the session id of every namespace of a thread begins with.
const threadPrefix = (threadId) => `langgraph/${[...threadId].length}/${threadId}/`;

// { threadId, checkpointNs } of a saver's session id, null for any other session (any client may name
// one langgraph/...): the length is ASCII digits as the savers write it, without a leading zero.
function parseSessionId(sessionId) {
  const m = /^langgraph\/(0|[1-9][0-9]*)\//.exec(sessionId);
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

// A decoded Step as a plain object: unset fields at their defaults, 64-bit integers as Numbers.
const STEP_OBJECT = { defaults: true, arrays: true, objects: true, longs: Number };

// writes_after_seq is 0 when absent (a Step written before it existed: its writes are read from the
// log's start).
function decodeStep(bytes) {
  const type = Step();
  const step = type.toObject(type.decode(bytes), STEP_OBJECT);
  step.writes_after_seq = step.writes_after_seq || 0;
  return step;
}

// The fields of a Step protobufjs's decode gives the value of their last occurrence in the bytes read (a
// message field too: it replaces, where protobuf's merge would merge it field by field).
const SINGULAR_FIELDS = ['checkpoint_id', 'parent_checkpoint_id', 'checkpoint', 'metadata', 'writes_after_seq'];

// decodeStep of each of `states`, a namespace's states oldest first. One that begins with the state
// before it (a MERGE chain's states each extend the one before) is decoded from the bytes after it alone,
// onto the Step before, as decoding the whole state reads those bytes: a singular field set there
// replaces the one before, repeated fields and map entries are added. A version's list elements are then
// decoded once, not once per later version, and the Steps share them.
function stepsOf(states) {
  const type = Step();
  const out = [];
  let before;
  for (const state of states) {
    let step;
    const n = before === undefined ? 0 : before.state.length;
    if (n > 0 && state.length > n && Buffer.compare(state.subarray(0, n), before.state) === 0) {
      const message = type.decode(state.subarray(n));
      const added = type.toObject(message, STEP_OBJECT);
      const older = before.step;
      step = {
        ...older,
        deleted_checkpoint_ids: older.deleted_checkpoint_ids.concat(added.deleted_checkpoint_ids),
        items: older.items.concat(added.items),
        channels: Object.assign({}, older.channels, added.channels),
      };
      // The Step before had writes_after_seq made 0 if absent; one set here is a number.
      for (const field of SINGULAR_FIELDS) {
        if (Object.prototype.hasOwnProperty.call(message, field)) step[field] = added[field];
      }
    } else {
      step = decodeStep(state);
    }
    out.push(step);
    before = { state, step };
  }
  return out;
}

// The elements (Typed) of a Step's list channels by channel: its items applied in order, each cutting
// the list at its start and extending it.
function elementsOf(step) {
  const out = new Map();
  for (const entry of step.items) {
    const elements = out.get(entry.channel) || [];
    if (entry.start > elements.length) {
      throw new Error(
        `checkpoint ${JSON.stringify(step.checkpoint_id)}: channel ${JSON.stringify(entry.channel)}'s items start at` +
          ` ${entry.start}, past its ${elements.length} elements`,
      );
    }
    elements.length = entry.start;
    for (const value of entry.values) elements.push(value);
    out.set(entry.channel, elements);
  }
  return out;
}

// An element's identity for telling which elements a step shares with its parent: xxh3-128 of its type,
// a NUL and its bytes, as the Python saver computes it.
const digestOf = (t) => xxh3.xxh128(Buffer.concat([Buffer.from(`${t.type}\0`, 'utf8'), Buffer.from(t.data || [])]));

// The digests of the list channels' elements of a stored Step, by channel.
function listsOf(step) {
  const lists = new Map();
  for (const [channel, elements] of elementsOf(step)) {
    const value = step.channels[channel];
    if (value !== undefined && value.type === ITEMS) lists.set(channel, elements.map(digestOf));
  }
  return lists;
}

// The list elements a Step's state holds, those later entries cut off included.
const storedElements = (step) => step.items.reduce((n, entry) => n + entry.values.length, 0);

// Whether a value is stored element by element: a plain array each of whose elements the serializer
// writes alone (JSON has no undefined, function or symbol element: such an array is stored whole).
function isList(value) {
  if (!Array.isArray(value) || Object.getPrototypeOf(value) !== Array.prototype) return false;
  for (let i = 0; i < value.length; i++) {
    const kind = typeof value[i];
    if (kind === 'undefined' || kind === 'function' || kind === 'symbol') return false;
  }
  return true;
}

// How many leading digests two lists share.
function commonPrefix(a, b) {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
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
// kept: writesOf(id, afterSeq) returns a checkpoint's folded writes once every event after afterSeq (its
// Step's writes_after_seq) was read. A reader made with `afterSeq` reads no event at or before it; with
// `page`, the first page of that read (a Get's `events`, asked with LogReader.filter(afterSeq)), the rest
// from its next_page_token when it is needed.
class LogReader {
  // The events a reader from `afterSeq` reads: a client's events() options, a Get's `events`.
  static filter(afterSeq) {
    return { types: [WRITES_EVENT], afterSeq, newestFirst: true, pageSize: 1000 };
  }

  constructor(client, sessionId, { afterSeq = 0, page } = {}) {
    this.floor = afterSeq;
    const filter = LogReader.filter(afterSeq);
    this.events = page === undefined ? client.events(sessionId, filter) : pageThenRest(client, sessionId, filter, page);
    this.byCheckpoint = new Map(); // id -> [{ seq, record }]
    this.lowest = Infinity; // every writes event from this seq on was read
    this.newest = 0; // the highest seq read
    this.done = false;
  }

  async writesOf(checkpointId, afterSeq) {
    if (afterSeq < this.floor) throw new Error(`the log was read after seq ${this.floor} only, not after ${afterSeq}`);
    while (this.lowest > afterSeq + 1 && !this.done) {
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
      this.lowest = event.seq;
      this.newest = Math.max(this.newest, event.seq);
      const record = decodeWrites(event.payload);
      const list = this.byCheckpoint.get(record.checkpoint_id) || [];
      list.push({ seq: event.seq, record });
      this.byCheckpoint.set(record.checkpoint_id, list);
    }
    const found = (this.byCheckpoint.get(checkpointId) || []).filter((f) => f.seq > afterSeq);
    found.sort((a, b) => a.seq - b.seq);
    return foldWrites(found.map((f) => f.record));
  }

  close() {
    this.events.return().catch(() => {});
  }
}

// The events of `page` (a ReadEventsResponse), then those after it from its token, if it was cut.
async function* pageThenRest(client, sessionId, filter, page) {
  yield* page.events;
  if (page.next_page_token) yield* client.events(sessionId, { ...filter, pageToken: page.next_page_token });
}

// serde.dumpsTyped(value) of the value as it is now. JsonPlusSerializer's dumpsTyped serializes before it
// returns, but gives a Uint8Array back as it is ("bytes"): that one is copied, else a change made to it in
// place once the call returned would be stored.
const dumpsNow = (serde, value) => serde.dumpsTyped(value instanceof Uint8Array ? new Uint8Array(value) : value);

// The values of the channels a step names (newVersions) serialized now (dumpsNow), by channel: { list,
// typed }, typed a promise of [type, data] (a list's: of its elements', element by element, so that a step
// stores the messages it added, not the conversation). A channel without a value is left out.
function serializeChannels(serde, values, newVersions) {
  const out = new Map();
  for (const channel of Object.keys(newVersions)) {
    if (!Object.prototype.hasOwnProperty.call(values, channel)) continue;
    const value = values[channel];
    const list = isList(value);
    const typed = list ? Promise.all(value.map((e) => dumpsNow(serde, e))) : dumpsNow(serde, value);
    out.set(channel, { list, typed: handled(typed) });
  }
  return out;
}

// `promise`, marked handled: a caller awaiting several in turn may throw at the first that fails, and leave
// a later one's failure unawaited (an unhandled rejection ends a Node process). Awaiting it still throws.
function handled(promise) {
  promise.catch(() => {});
  return promise;
}

module.exports = {
  EMPTY,
  ID_LABEL,
  ITEMS,
  LogReader,
  MAX_LABEL_BYTES,
  RECORDS_FILE,
  RUN_LABEL,
  STEP_TYPE,
  THREAD_LABEL,
  WRITES_EVENT,
  bytesOf,
  commonPrefix,
  decodeStep,
  digestOf,
  dumpsNow,
  elementsOf,
  emptyTyped,
  encodeStep,
  encodeWrites,
  foldWrites,
  handled,
  isList,
  listsOf,
  parseSessionId,
  records,
  serializeChannels,
  sessionIdOf,
  stepsOf,
  storedElements,
  threadPrefix,
  typed,
  utf8Bytes,
};
