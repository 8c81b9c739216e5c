// The tool-result cache of the Node.js client: a tool call's result recorded in
// its session's Checkpoint.tool_cache before it is returned, so that an agent
// restarted after a paid call does not pay for it again. The key is the one the
// Python clients compute (sidecar/client/toolcache.py): the hex XXH3-128 of the
// UTF-8 bytes of the tool name, a NUL and the canonical JSON of the arguments
// (no whitespace, object keys sorted by UTF-16 code units, JSON.stringify's
// strings and numbers), so either client hits what the other recorded.
'use strict';

const path = require('path');
const { xxh3 } = require('@node-rs/xxhash');
const { PROTO_ROOT } = require('./proto_root');

const CHECKPOINT = 'ckpt.v1.Checkpoint';
// gRPC status codes cachedCall tells apart.
const INVALID_ARGUMENT = 3;
const NOT_FOUND = 5;

let checkpointType = null;

// ckpt.v1.Checkpoint as a protobufjs type, loaded from proto/ once (field names as in the .proto).
function checkpoint() {
  if (checkpointType === null) {
    const protobuf = require('protobufjs');
    const root = new protobuf.Root();
    // google/protobuf's files are protobufjs's own; ours are under proto/.
    root.resolvePath = (origin, target) => (target.startsWith('google/protobuf/') ? target : path.join(PROTO_ROOT, target));
    root.loadSync('ckpt/v1/checkpoint.proto', { keepCase: true });
    checkpointType = root.lookupType(CHECKPOINT);
  }
  return checkpointType;
}

// `value` as canonical JSON: JSON.stringify's text with object keys sorted, or a TypeError naming where in
// `value` (`path`: args.q, result[2]) what is not a JSON value is: undefined, a function, a symbol, a BigInt,
// NaN or an infinity, a lone surrogate, or an object neither an array nor plain (of Object.prototype or
// none; a Map or a Set, which JSON.stringify would write as {}). A toJSON() is applied first, as
// JSON.stringify applies it (a Date is its string).
function canonicalJson(value, path = 'value') {
  if (value === null) return 'null';
  switch (typeof value) {
    case 'boolean':
      return value ? 'true' : 'false';
    case 'number':
      if (!Number.isFinite(value)) throw new TypeError(`${path}: ${value} has no JSON form`);
      return JSON.stringify(value);
    case 'string':
      if (!value.isWellFormed()) throw new TypeError(`${path}: a string holds a lone surrogate, which is not text: it has no canonical JSON`);
      return JSON.stringify(value);
    case 'object':
      break;
    default:
      throw new TypeError(`${path}: ${typeof value} is not a JSON value`);
  }
  if (typeof value.toJSON === 'function') return canonicalJson(value.toJSON(), path);
  if (Array.isArray(value)) return `[${Array.from(value, (item, i) => canonicalJson(item, `${path}[${i}]`)).join(',')}]`;
  const proto = Object.getPrototypeOf(value);
  if (proto !== Object.prototype && proto !== null) {
    throw new TypeError(`${path}: ${kindOf(proto)} is not a JSON value (null, a boolean, number or string, an array, a plain object)`);
  }
  // The default sort compares UTF-16 code units, as the Python clients do.
  const keys = Object.keys(value).sort();
  return `{${keys.map((k) => `${canonicalJson(k, member(path, k))}:${canonicalJson(value[k], member(path, k))}`).join(',')}}`;
}

// What an object of prototype `proto` is, for an error: "a Map", "an object of another prototype".
function kindOf(proto) {
  const ctor = Object.prototype.hasOwnProperty.call(proto, 'constructor') ? proto.constructor : undefined;
  return typeof ctor === 'function' && ctor.name ? `a ${ctor.name}` : 'an object of another prototype';
}

// The path of member `key` of the object at `path`: args.q, or args["a b"].
function member(path, key) {
  return /^[A-Za-z_$][\w$]*$/.test(key) ? `${path}.${key}` : `${path}[${JSON.stringify(key)}]`;
}

// The cache key of a call of `tool` with `args`, and the arguments' canonical JSON.
function toolCacheKey(tool, args) {
  if (typeof tool !== 'string') throw new TypeError(`tool must be a string, not ${typeof tool}`);
  if (tool.includes('\0')) throw new TypeError(`tool ${JSON.stringify(tool)} holds a NUL, which separates it from the arguments in the key`);
  if (!tool.isWellFormed()) throw new TypeError('tool holds a lone surrogate');
  const canonical = canonicalJson(args, 'args');
  const key = xxh3.xxh128(Buffer.from(`${tool}\0${canonical}`, 'utf8')).toString(16).padStart(32, '0');
  return { key, canonical };
}

// The session's state holding its tool cache: masked to tool_cache when the session is typed, whole when
// it is not (no type to mask by); null when there is no session yet.
async function readCache(client, sessionId) {
  try {
    return await client.get(sessionId, 0, { fieldMask: ['tool_cache'] });
  } catch (err) {
    if (err.code === NOT_FOUND) return null;
    if (err.code === INVALID_ARGUMENT) return client.get(sessionId);
    throw err;
  }
}

// Whether a recorded `result` is JSON (UTF-8 text, no BOM) and its value: { ok, value }. A result that is
// not (empty, written by another writer) answers no call, so the call misses, as the Python clients'.
function readResult(result) {
  try {
    const text = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(result);
    return { ok: true, value: JSON.parse(text) };
  } catch (err) {
    if (err instanceof SyntaxError || err instanceof TypeError) return { ok: false };
    throw err;
  }
}

// See CheckpointClient.cachedCall.
async function cachedCall(client, sessionId, tool, args, fn) {
  const { key, canonical } = toolCacheKey(tool, args);
  const Checkpoint = checkpoint();
  const got = await readCache(client, sessionId);
  let messageType = CHECKPOINT;
  if (got !== null) {
    if (got.message_type !== '' && got.message_type !== CHECKPOINT) {
      throw new TypeError(`cachedCall records tool results in a ${CHECKPOINT}; session ${JSON.stringify(sessionId)} holds ${got.message_type}`);
    }
    messageType = got.message_type; // '' keeps an untyped session untyped
    const entry = Checkpoint.decode(got.state).tool_cache[key];
    // An entry whose result is kept in an artifact (the cache does not fetch it) answers no call.
    if (entry && !entry.is_error && !entry.artifact_id && entry.tool === tool && entry.canonical_args_json === canonical) {
      const recorded = readResult(entry.result);
      if (recorded.ok) return recorded.value;
    }
  }
  const result = canonicalJson(await fn(), 'result');
  const now = Date.now();
  const patch = Checkpoint.encode({
    tool_cache: {
      [key]: {
        tool,
        canonical_args_json: canonical,
        result: Buffer.from(result, 'utf8'),
        created_at: { seconds: Math.floor(now / 1000), nanos: (now % 1000) * 1e6 },
      },
    },
  }).finish();
  await client.merge(sessionId, patch, { messageType });
  return JSON.parse(result);
}

module.exports = { cachedCall, canonicalJson, toolCacheKey };
