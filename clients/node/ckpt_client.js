// A small Node.js client for the ckpt sidecar. It needs nothing but the
// .proto files in proto/: the service is loaded at run time with
// @grpc/proto-loader, so any language with a gRPC library can do the same.
'use strict';

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { checkBoolean, checkFixed64, checkInt, checkString, kindOf, newRequestId, stateBytes, stringMap, timestamp } = require('./arguments');
const { blobChunks, blobToFile, getBlobRequest, putBlob } = require('./blobs');
const { descriptorSet } = require('./descriptor_set');
const { appendEventsRequest, eventPages, readEventsRequest } = require('./events');
const { closedError, pause, retryDelayMs, streamPuts } = require('./put_stream');
const { PROTO_ROOT } = require('./proto_root');
const { cachedCall, canonicalJson, toolCacheKey } = require('./tool_cache');

// The sidecar's default --max-message-bytes; raise both for states over 64 MiB.
const MAX_MESSAGE_BYTES = 64 * 1024 * 1024;
// The least maxMessageBytes taken (the Python clients' bound too).
const MIN_MESSAGE_BYTES = 1024;
// The most versions a ListVersions page holds (service.proto).
const MAX_PAGE_SIZE = 1000;
// The most writes a PutStream message holds (the sidecar's limit, as the Python clients' batch_size).
const MAX_STREAM_BATCH_PUTS = 1000;
// The longest timeoutMs: 100 years, as the Python clients' timeout_seconds.
const MAX_TIMEOUT_MS = 100 * 365.25 * 24 * 3600 * 1000;

const LOAD_OPTIONS = {
  keepCase: true,
  longs: Number, // versions and sizes stay far below 2^53; fixed64s (state_xxh3) are read exactly below
  enums: String,
  defaults: true,
  oneofs: true,
};

// The service's stub class, and the protobufjs Root its messages are sized with.
function loadService() {
  const definition = protoLoader.loadSync('ckpt/v1/service.proto', { includeDirs: [PROTO_ROOT], ...LOAD_OPTIONS });
  const root = readFixed64Exactly(definition);
  return { Service: grpc.loadPackageDefinition(definition).ckpt.v1.CheckpointService, root };
}

// How to set every fixed64 reachable from a message of `type` (a state_xxh3: an XXH3-64, mostly over
// 2^53, where a Number holds another value) on its object as its decimal string, from the decoded
// message: fix(message, object), or null when the type reaches none.
function fixed64Fixer(type, fixers = new Map()) {
  if (fixers.has(type)) return fixers.get(type);
  fixers.set(type, null); // a type within itself reaches nothing more
  const protobuf = require('protobufjs');
  const steps = [];
  for (const field of type.fieldsArray) {
    const name = field.name;
    if (field.type === 'fixed64' && !field.repeated && !field.map) {
      // The decoded value is an unsigned Long (long.js, which protobufjs reads 64-bit fields with).
      steps.push((m, o) => {
        const v = m[name];
        if (v !== null && v !== undefined) o[name] = ((BigInt(v.high >>> 0) << 32n) | BigInt(v.low >>> 0)).toString();
      });
    } else if (field.resolvedType instanceof protobuf.Type && !field.map) {
      const inner = fixed64Fixer(field.resolvedType, fixers);
      if (inner === null) continue;
      if (field.repeated) steps.push((m, o) => m[name].forEach((each, i) => inner(each, o[name][i])));
      else steps.push((m, o) => m[name] && inner(m[name], o[name]));
    }
  }
  const fix = steps.length === 0 ? null : (m, o) => steps.forEach((step) => step(m, o));
  fixers.set(type, fix);
  return fix;
}

// proto-loader's `longs` is one type for every 64-bit field: the replies holding a fixed64 are read
// with protobufjs (the same decoding and options) and their fixed64s set as decimal strings, which a
// write's expectedStateXxh3 takes back.
function readFixed64Exactly(definition) {
  const protobuf = require('protobufjs');
  const root = new protobuf.Root();
  root.resolvePath = (origin, target) => path.join(PROTO_ROOT, target);
  root.loadSync('ckpt/v1/service.proto', { keepCase: true }).resolveAll();
  const service = root.lookupService('ckpt.v1.CheckpointService');
  for (const method of service.methodsArray) {
    const type = method.resolvedResponseType;
    const fix = fixed64Fixer(type);
    if (fix === null) continue;
    definition['ckpt.v1.CheckpointService'][method.name].responseDeserialize = (buffer) => {
      const message = type.decode(buffer);
      const object = type.toObject(message, LOAD_OPTIONS);
      fix(message, object);
      return object;
    };
  }
  return root;
}

// What `fn()` resolves to; if `client`'s close() ended it, the error of a call made after close().
async function untilClosed(client, fn) {
  try {
    return await fn();
  } catch (err) {
    throw client.closed ? closedError() : err;
  }
}

// The chunks of a blob read on `client`, as untilClosed.
async function* chunksUntilClosed(client, chunks) {
  try {
    yield* chunks;
  } catch (err) {
    throw client.closed ? closedError() : err;
  }
}

// Each version of a ListVersions page given its whole state where the sidecar sent it as the bytes after the
// next older entry's (state_suffix, ListVersionsRequest.states_as_suffixes): oldest first, as a get returns it.
function joinStateSuffixes(versions) {
  let older = null;
  for (let i = versions.length - 1; i >= 0; i--) {
    const version = versions[i];
    if (version._state_suffix === 'state_suffix') {
      if (older === null) {
        const message = `ListVersions: version ${version.version}, the oldest of its page, came as a ${version.state_suffix.length}-byte suffix of no state`;
        throw Object.assign(new Error(`${grpc.status.DATA_LOSS} DATA_LOSS: ${message}`), { code: grpc.status.DATA_LOSS, details: message });
      }
      version.state = Buffer.concat([older, version.state_suffix]);
      delete version.state_suffix;
      delete version._state_suffix;
    }
    older = version.state;
  }
}

class ConflictError extends Error {
  constructor(message, currentVersion) {
    super(message);
    this.name = 'ConflictError';
    this.currentVersion = currentVersion;
  }
}

class CheckpointClient {
  // target: "unix:/path/ckpt.sock" or "host:port". timeoutMs bounds a whole
  // call, retries included; UNAVAILABLE is retried `retries` (8) times, backing
  // off from 50 ms doubling to 1 s (4.55 s of waits), as the Python clients do. tls, for a
  // host:port sidecar serving TLS (`ckpt serve --tls-cert-file`):
  // { rootCerts, certChain, privateKey } as PEM Buffers (rootCerts: the CA
  // that signed the sidecar's certificate, null for the system's; certChain
  // and privateKey: this client's, when the sidecar requires one), and
  // serverName when the certificate does not name the target's host.
  // maxMessageBytes: the largest message sent or taken; keep it equal to the
  // sidecar's --max-message-bytes (both 64 MiB by default).
  // timeoutMs: more than 0 and at most 100 years (a RangeError naming it otherwise, as in Python).
  constructor(target, { timeoutMs = 30000, retries = 8, tls = null, maxMessageBytes = MAX_MESSAGE_BYTES } = {}) {
    if (typeof timeoutMs !== 'number') throw new TypeError(`timeoutMs must be a Number, not ${kindOf(timeoutMs)}`);
    if (!(timeoutMs > 0 && timeoutMs <= MAX_TIMEOUT_MS)) {
      throw new RangeError(`timeoutMs must be > 0 and at most ${MAX_TIMEOUT_MS} (100 years), got ${timeoutMs}`);
    }
    // As Python's: retries a whole count (Infinity too: then timeoutMs alone bounds a call), maxMessageBytes
    // what gRPC takes (a 32-bit signed length).
    if (retries !== Infinity) checkInt('retries', retries);
    checkInt('maxMessageBytes', maxMessageBytes, { low: MIN_MESSAGE_BYTES, high: 2 ** 31 - 1 });
    const { Service, root } = loadService();
    const credentials = tls
      ? grpc.credentials.createSsl(tls.rootCerts || null, tls.privateKey || null, tls.certChain || null)
      : grpc.credentials.createInsecure();
    const nameOverride = tls && tls.serverName ? { 'grpc.ssl_target_name_override': tls.serverName } : {};
    this.channelStub = new Service(target, credentials, {
      ...nameOverride,
      'grpc.max_receive_message_length': maxMessageBytes,
      'grpc.max_send_message_length': maxMessageBytes,
      // The sidecar is local: reconnect within the retries' backoff, not after
      // gRPC's default of 1 s growing to 2 min.
      'grpc.initial_reconnect_backoff_ms': 50,
      'grpc.min_reconnect_backoff_ms': 50,
      'grpc.max_reconnect_backoff_ms': 250,
    });
    this.target = target;
    this.timeoutMs = timeoutMs;
    this.retries = retries;
    this.maxMessageBytes = maxMessageBytes;
    this.protoRoot = root;
    this.closed = false;
    // The calls under way, cancelled by close(), and what else close() ends (a putStream waiting on `puts`).
    this.openCalls = new Set();
    this.onClose = new Set();
    // The stub's methods, each call they start tracked until it ends.
    this.trackedStub = {};
    for (const method of Object.keys(Service.service)) {
      this.trackedStub[method] = (...args) => {
        const call = this.channelStub[method](...args);
        this.openCalls.add(call);
        call.on('status', () => this.openCalls.delete(call));
        return call;
      };
    }
  }

  // One request, resent unchanged (a Put keeps its request_id, so a retry
  // after a lost reply never writes twice). A Put's error carries its
  // requestId: resend the same write with it to learn its outcome.
  // retry: false for calls a resend could not answer as the first would
  // have (a fork or delete whose reply was lost would fail the second time).
  async call(method, request, { retry = true } = {}) {
    const deadline = Date.now() + this.timeoutMs;
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.once(method, request, deadline);
      } catch (caught) {
        // A call close() cancelled fails as one made after it, never retried.
        const err = this.closed ? closedError() : caught;
        const delayMs = retryDelayMs(err, { retry, attempt, retries: this.retries });
        if (delayMs === null || Date.now() + delayMs >= deadline) {
          if (request.request_id) err.requestId = request.request_id;
          if (err.code === grpc.status.DEADLINE_EXCEEDED) {
            // gRPC names the address when it cannot connect, not when a sidecar it reached stops answering.
            err.details = `the sidecar at ${this.target} did not answer within the call's timeout (timeoutMs=${this.timeoutMs})`;
            err.message = `${err.code} DEADLINE_EXCEEDED: ${err.details}`;
          }
          throw err;
        }
        await pause(this, delayMs); // woken by close(): the next attempt fails as the client's closed error
      }
    }
  }

  once(method, request, deadline) {
    return new Promise((resolve, reject) => {
      this.stub[method](request, { deadline }, (err, reply) => {
        if (!err) return resolve(reply);
        if (err.code === grpc.status.ABORTED) {
          const head = err.metadata && err.metadata.get('ckpt-current-version')[0];
          const conflict = new ConflictError(err.details, Number(head || 0));
          conflict.code = err.code;
          // An append's expectedLastSeq conflict carries the event log's last seq instead.
          const lastSeq = err.metadata && err.metadata.get('ckpt-last-seq')[0];
          if (lastSeq !== undefined) conflict.lastSeq = Number(lastSeq);
          return reject(conflict);
        }
        reject(err);
      });
    });
  }

  // messageType: the registered type `state` holds (e.g. 'acme.agent.v1.State'); the session keeps it.
  // expectedVersion, expectedStateXxh3: compare-and-set; write only if the head is that version, and if
  // its state has that XXH3-64 (the `state_xxh3` of the reply that wrote it, or of a get's `info`: a
  // decimal string; a BigInt is taken too), else ConflictError (its currentVersion the head's) and
  // nothing is written. Only the second tells the head you hold from another state at the same version
  // (the session deleted and written again). The reply's `state_xxh3` is the new head's.
  put(sessionId, state, { expectedVersion, expectedStateXxh3, requestId, labels, messageType } = {}) {
    const mode = 'WRITE_MODE_REPLACE';
    return this.call(
      'Put',
      this.request(sessionId, state, mode, expectedVersion, requestId, labels, messageType, expectedStateXxh3),
    );
  }

  // A read-modify-merge that must land on the state it read passes that state's `state_xxh3`:
  // merge(s, patch, { expectedVersion: got.version, expectedStateXxh3: got.info.state_xxh3 }).
  merge(sessionId, patch, { expectedVersion, expectedStateXxh3, requestId, labels, messageType } = {}) {
    const mode = 'WRITE_MODE_MERGE';
    return this.call(
      'Put',
      this.request(sessionId, patch, mode, expectedVersion, requestId, labels, messageType, expectedStateXxh3),
    );
  }

  request(sessionId, state, mode, expectedVersion, requestId, labels, messageType, expectedStateXxh3) {
    const req = {
      session_id: checkString('sessionId', sessionId),
      state: stateBytes('state', state),
      mode,
      request_id: requestId === undefined || requestId === null || requestId === '' ? newRequestId() : checkString('requestId', requestId),
      labels: stringMap('labels', labels),
      message_type: messageType === undefined || messageType === null ? '' : checkString('messageType', messageType),
    };
    if (expectedVersion !== undefined && expectedVersion !== null) {
      req.expected_version = checkInt('expectedVersion', expectedVersion);
    }
    if (expectedStateXxh3 !== undefined && expectedStateXxh3 !== null) {
      req.expected_state_xxh3 = checkFixed64('expectedStateXxh3', expectedStateXxh3);
    }
    return req;
  }

  // Register `typeName` of a protobufjs Root (protobuf.loadSync('state.proto'))
  // with the sidecar, so that puts can name it (messageType); resolves to the
  // full names of the message types registered. Registering again is harmless.
  // fileName: the name of its package's file, when other clients register the
  // same type under the name protoc gives it ('acme/agent/v1/state.proto'):
  // a type is defined by one file only. Each file is described as protoc
  // would describe it, in its .proto's syntax (descriptor_set.js).
  async registerType(root, typeName, { fileName } = {}) {
    checkString('typeName', typeName);
    if (fileName !== undefined && fileName !== null) checkString('fileName', fileName);
    const reply = await this.call('RegisterType', { file_descriptor_set: descriptorSet(root, typeName, fileName) });
    return reply.message_types;
  }

  // fieldMask: only these fields of a typed session's state (paths of field
  // names: ['handoff', 'plan'], 'handoff.next'), every other one cleared.
  // events: a filter as events() takes: the reply's `events` also holds the
  // first page of those events, read in the same call (one round trip rather
  // than a get and an events read); its `next_page_token`, if not empty, is
  // the rest: events(sessionId, { ...filter, pageToken }).
  // knownStateXxh3: the `state_xxh3` of a state the caller holds (a put's
  // reply's, a get's `info`'s): if the version read has that state, the reply
  // leaves it out (`state_omitted` true, `state` empty). Not with fieldMask.
  get(sessionId, version = 0, { fieldMask, events, knownStateXxh3 } = {}) {
    const request = { session_id: checkString('sessionId', sessionId), version: checkInt('version', version) };
    if (fieldMask !== undefined) {
      if (!Array.isArray(fieldMask)) throw new TypeError(`fieldMask must be an array of paths, not ${kindOf(fieldMask)}`);
      request.field_mask = { paths: fieldMask.map((p, i) => checkString(`fieldMask[${i}]`, p)) };
    }
    if (events !== undefined && events !== null) request.events = readEventsRequest(sessionId, events);
    if (knownStateXxh3 !== undefined && knownStateXxh3 !== null) {
      request.known_state_xxh3 = checkFixed64('knownStateXxh3', knownStateXxh3);
    }
    return this.call('Get', request);
  }

  // The result of `fn()` (awaited), the call of `tool` with `args` (JSON
  // values), recorded in the session's Checkpoint.tool_cache so that it is paid
  // for once: a hit returns the recorded result without calling `fn` (an entry
  // marked is_error, holding an artifact_id or a result that is not JSON is a
  // miss, and the record replaces it); a miss calls it and records its result
  // (a JSON value) with a durable merge before resolving to it, so an agent
  // killed after that does not call the tool again. Either way the value is
  // the recorded JSON parsed back. If `fn` throws, nothing is recorded. Two
  // callers missing the same key at once both call `fn`; the later record
  // wins, whole. Same key as the Python clients (tool_cache.js), so either
  // hits what the other recorded.
  cachedCall(sessionId, tool, args, fn) {
    return cachedCall(this, sessionId, tool, args, fn);
  }

  // Every version, newest first, from `startVersion` back (0: from the head).
  // `includeStates`: each VersionInfo's `state` holds that version's state,
  // what a get of it returns, the sidecar decoding each delta chain once
  // rather than once per version (one call per page, not a Get per version);
  // a page then ends early rather than pass the sidecar's message limit, and
  // a single state over it is RESOURCE_EXHAUSTED naming the version.
  // `limit`: at most that many versions, no page asking for more than are
  // left, so that the versions (and states) held stay bounded.
  async history(sessionId, { includeStates = false, startVersion = 0, pageSize = 100, limit } = {}) {
    const request = {
      session_id: checkString('sessionId', sessionId),
      page_size: checkInt('pageSize', pageSize, { high: MAX_PAGE_SIZE }),
      page_token: '',
      include_states: checkBoolean('includeStates', includeStates),
      start_version: checkInt('startVersion', startVersion),
      states_as_suffixes: includeStates, // joined back below: callers see each version's whole state
    };
    const most = limit === undefined ? Infinity : checkInt('limit', limit, { low: 1 });
    const versions = [];
    do {
      // No page asks for more than are left (nor for the sidecar's default, 0, once a page can hold them).
      const left = most - versions.length;
      if (left < pageSize || (pageSize === 0 && left <= MAX_PAGE_SIZE)) request.page_size = left;
      const page = await this.call('ListVersions', request);
      joinStateSuffixes(page.versions);
      versions.push(...page.versions);
      request.page_token = page.next_page_token;
    } while (request.page_token && versions.length < most);
    return versions;
  }

  // Every session carrying all of `labels`, last written at or after
  // `updatedAfter` and before `updatedBefore` (Dates), and whose id starts with `prefix`, if given,
  // fetched a page at a time as you iterate: for await (const s of client.sessions()). pageSize: 0..1000
  // (0: the sidecar's default, 100). A prefix alone reads only the sessions of the prefix.
  async *sessions({ labels, updatedAfter, updatedBefore, prefix = '', pageSize = 100 } = {}) {
    const request = {
      label_filter: stringMap('labels', labels),
      page_size: checkInt('pageSize', pageSize, { high: MAX_PAGE_SIZE }),
      page_token: '',
      session_id_prefix: checkString('prefix', prefix),
    };
    if (updatedAfter !== undefined) request.updated_after = timestamp('updatedAfter', updatedAfter);
    if (updatedBefore !== undefined) request.updated_before = timestamp('updatedBefore', updatedBefore);
    do {
      const page = await this.call('ListSessions', request);
      yield* page.sessions;
      request.page_token = page.next_page_token;
    } while (request.page_token);
  }

  // Append `events` ({ type, payload, attributes, time }: payload bytes or a
  // string sent as UTF-8, time a Date, else the commit's) to the session's
  // event log, and with `put` ({ state, merge, expectedVersion,
  // expectedStateXxh3, labels, messageType }, as put's) write a checkpoint in
  // the same transaction: both are committed or neither (a ConflictError on
  // the put appends nothing). Resolves to { first_seq, last_seq, put,
  // replayed }, `put` the checkpoint's PutResponse (its state_xxh3 too).
  // Retried as put is, with one request id per call (`requestId`, else a
  // generated one) sent unchanged on every retry, so a retry appends nothing
  // twice and answers `replayed`; the error carries it as `requestId`.
  appendEvents(sessionId, events, { put, requestId, expectedLastSeq } = {}) {
    return this.call('AppendEvents', appendEventsRequest(sessionId, events, { put, requestId, expectedLastSeq }));
  }

  // The session's events, each with its `seq` and `time`, oldest first (or
  // `newestFirst`), after seq `afterSeq`, of any of `types` (empty: all), with
  // a time after `after` and before `before` (Dates), fetched `pageSize` at a
  // time as you iterate: for await (const e of client.events(id)). NOT_FOUND
  // if the session has neither events nor versions. Arguments are checked
  // here, before anything is sent. pageToken: read on from a page's
  // next_page_token (a get's `events`), with the same filter.
  events(sessionId, options = {}) {
    return eventPages(this, readEventsRequest(sessionId, options));
  }

  // Create `newSessionId` whose version 1 is `version` (0 = the latest) of
  // `sessionId` (`copyEvents`: with a copy of its event log, seqs and times as
  // they are); resolves to its SessionInfo. Not retried, as in Python.
  async fork(sessionId, newSessionId, { version = 0, labels, copyEvents = false } = {}) {
    const request = {
      session_id: checkString('sessionId', sessionId),
      new_session_id: checkString('newSessionId', newSessionId),
      version: checkInt('version', version),
      labels: stringMap('labels', labels),
      copy_events: checkBoolean('copyEvents', copyEvents),
    };
    return (await this.call('Fork', request, { retry: false })).session;
  }

  // Store a blob (an artifact: a screenshot, a page, a log) referenced by
  // `sessionId`, once by its SHA-256; resolves to its ArtifactRef { uri,
  // content_hash, size_bytes, media_type } (uri 'ckpt-blob:sha256:<hex>').
  // `data`: a Buffer or Uint8Array, or a Readable (fs.createReadStream(path))
  // or an (async) iterable of them, sent `chunkSizeBytes` (1 MiB) per
  // message, each written out under HTTP/2 flow control before the next is
  // read, so a stream is never held whole. `expectedSha256`: the bytes must
  // hash to it (INVALID_ARGUMENT otherwise). Nothing is stored on an error,
  // nor when `data` throws (its error is thrown once the sidecar refused the
  // stream). Not retried nor bounded by timeoutMs: a stream may not be read
  // twice. close(), or the call failing, ends it at once even while `data`
  // waits for its next piece, and stops `data` (a Readable is destroyed, an
  // iterator's return() called). Destroying the Readable yourself stops it
  // mid-stream: it rejects with the Readable's error, nothing stored.
  async putBlob(data, options = {}) {
    return untilClosed(this, () => putBlob(this.stub, this.maxMessageBytes, data, options));
  }

  // A blob's bytes, or `length` of them (0: to the end) from `offset`, as an
  // async iterator of Buffers (1 MiB chunks; a stream.Readable with
  // Readable.from). `ref`: an ArtifactRef, its uri, 'sha256:<hex>' or the
  // hex digits. NOT_FOUND for a blob never stored or removed; DATA_LOSS for a
  // whole blob whose bytes do not hash to it (the chunks before are not its
  // bytes), or a file cut short or gone (a range is not hashed). Stopping early
  // cancels the call. Retried as a unary read (UNAVAILABLE, a sidecar
  // restarting: up to `retries` times, the same backoff) until the first chunk
  // is yielded; a failure after that is thrown (call again for the blob). Not
  // bounded by timeoutMs: `retries` alone bounds the retries.
  getBlob(ref, { offset = 0, length = 0 } = {}) {
    const request = getBlobRequest(ref, { offset, length });
    if (this.closed) throw closedError();
    return chunksUntilClosed(this, blobChunks(this, request));
  }

  // Write a blob (or a range, as getBlob) to the file at `file`; resolves to
  // the bytes written. It is written beside it and renamed into place once
  // whole: on an error no partial file is left, and a file already there is
  // untouched. Retried as getBlob, until the first chunk is written. Only
  // close() stops it; a process killed under it leaves the hidden
  // `.<name>.<hex>.partial` beside `file`.
  async getBlobToFile(ref, file, { offset = 0, length = 0 } = {}) {
    return untilClosed(this, () => blobToFile(this, getBlobRequest(ref, { offset, length }), file));
  }

  // Remove a session, all its versions and its event log; resolves to how
  // many versions were removed. Not retried, as in Python.
  async delete(sessionId) {
    const request = { session_id: checkString('sessionId', sessionId) };
    return (await this.call('DeleteSession', request, { retry: false })).deleted_versions;
  }

  // Many writes on one PutStream, `batchSize` (1..1000) to a message: an
  // async iterator of one PutResult per write, in order: { outcome:
  // 'response', response } or { outcome: 'error', error: { code, message,
  // current_version } } (a failed write, e.g. a conflict; the others go on).
  // `puts` is an iterable or async iterable of { sessionId, state, merge,
  // expectedVersion, expectedStateXxh3, requestId, labels, messageType }
  // (as put's). A batch is sent once `batchSize` writes are ready, before a
  // write that would take it past maxMessageBytes (a write too big for any
  // message ends the writes as a bad argument does), or when no further one is
  // ready yet (an agent giving a write per step gets each answered before its
  // next step), one batch in flight at a time. close() ends it CANCELLED, with
  // `answered` and `unanswered` as below, the writes not sent dropped. If `puts` throws (or gives a write with a bad argument), the
  // writes it gave before are sent and answered, then its error is thrown.
  // Each write keeps one request id (its own or a generated one), so when
  // the stream breaks with UNAVAILABLE or CANCELLED (a sidecar restart) the
  // batch sent and not answered is resent on a new stream and lands once
  // (`replayed` on what was committed before the break); so are the writes a
  // stopping sidecar answered UNAVAILABLE without queuing them, the last of
  // their batch. `retries` counts reconnects since the last answer (a run
  // of them also ends `timeoutMs` after its first failure, as a unary call's
  // retries do) and `timeoutMs` bounds each wait for an answer; giving up
  // throws the error with `answered` (the results yielded) and `unanswered`
  // (copies of the writes sent and not answered, each with the requestId it
  // was sent with: putStream(err.unanswered) resends them as they are) on it. A bad `puts` or `batchSize` throws here, before anything is sent.
  putStream(puts, { batchSize = 64 } = {}) {
    if (puts === null || puts === undefined || !(puts[Symbol.asyncIterator] || puts[Symbol.iterator])) {
      throw new TypeError(`puts must be an iterable or async iterable of writes, not ${kindOf(puts)}`);
    }
    return streamPuts(this, puts, checkInt('batchSize', batchSize, { low: 1, high: MAX_STREAM_BATCH_PUTS }));
  }

  // The generated stub, its calls tracked; a call on a closed client fails as the Python clients' do
  // (ClientClosedError): CANCELLED naming close(), not gRPC's "Channel has been shut down" without a
  // code, and not retried.
  get stub() {
    if (this.closed) throw closedError();
    return this.trackedStub;
  }

  // Cancels the calls under way and closes the channel: calls in flight (a putStream's too, even one
  // waiting on `puts`; a putBlob waiting on its data; a call waiting to retry, its timer cleared) fail
  // CANCELLED naming close(), as later calls do; nothing more is sent.
  close() {
    if (this.closed) return;
    this.closed = true;
    for (const end of this.onClose) end();
    this.onClose.clear();
    for (const call of this.openCalls) call.cancel();
    this.openCalls.clear();
    this.channelStub.close();
  }
}

module.exports = { CheckpointClient, ConflictError, canonicalJson, toolCacheKey };
