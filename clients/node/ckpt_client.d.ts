// Types of ckpt_client.js. Messages keep the proto's field names (proto-loader
// keepCase), 64-bit integers are Numbers (fixed64 hashes, state_xxh3, decimal
// strings: a Number is not exact over 2^53) and enums their names as strings.

export type FrameKind = 'FRAME_KIND_UNSPECIFIED' | 'FRAME_KIND_FULL' | 'FRAME_KIND_DELTA' | 'FRAME_KIND_PATCH' | 'FRAME_KIND_PREFIX';
export type WriteMode = 'WRITE_MODE_UNSPECIFIED' | 'WRITE_MODE_REPLACE' | 'WRITE_MODE_MERGE';

/** google.protobuf.Timestamp */
export interface Timestamp {
  seconds: number;
  nanos: number;
}

export interface PutResponse {
  version: number;
  stored_bytes: number;
  frame_kind: FrameKind;
  replayed: boolean;
  state_size: number;
  /**
   * XXH3-64 of the state this write made (the new head's), as a decimal string: pass it as the next
   * write's `expectedStateXxh3`. A replay answers the first write's ('0' if it was recorded before
   * sidecars kept it).
   */
  state_xxh3: string;
}

export interface VersionInfo {
  version: number;
  parent_version: number;
  created_at: Timestamp | null;
  frame_kind: FrameKind;
  stored_bytes: number;
  state_size: number;
  labels: Record<string, string>;
  mode: WriteMode;
  /** The version's state when `history` was asked for states (`includeStates`); empty otherwise. */
  state: Buffer;
  /**
   * XXH3-64 of the version's whole state (a masked get's info too), as a decimal string: pass it as a
   * write's `expectedStateXxh3` to write on top of exactly this state.
   */
  state_xxh3: string;
}

export interface HistoryOptions {
  /** Also return each version's state (VersionInfo.state). Default false. */
  includeStates?: boolean;
  /** List from this version back; 0 (the default): from the head. */
  startVersion?: number;
  /** Versions per page, up to 1000; 0: the sidecar's default (100). Default 100. */
  pageSize?: number;
  /** At most this many versions (1 or more): no page asks for more than are left. Default: every one. */
  limit?: number;
}

export interface GetResponse {
  version: number;
  state: Buffer;
  info: VersionInfo | null;
  /** The message type the state holds, if that version was written typed; '' for opaque bytes. */
  message_type: string;
  /** The page of events `get`'s `events` filter asked for; null without one. */
  events: ReadEventsResponse | null;
  /** Set when `state` is left out: the version read has the state `knownStateXxh3` named. */
  state_omitted: boolean;
}

/** A page of events. */
export interface ReadEventsResponse {
  events: Event[];
  /** Pass to events() as `pageToken`, with the same filter, for the rest; '' after the last page. */
  next_page_token: string;
  /** When the session's event log was created (null: it has none); a log deleted and written again has another. */
  log_created_at: Timestamp | null;
}

export interface SessionInfo {
  session_id: string;
  head_version: number;
  created_at: Timestamp | null;
  updated_at: Timestamp | null;
  labels: Record<string, string>;
  stored_bytes: number;
  version_count: number;
  forked_from_session_id: string;
  forked_from_version: number;
  /** The session's message type; '' if untyped. */
  message_type: string;
}

export interface PutError {
  /** gRPC status code number (10 = ABORTED for a version conflict). */
  code: number;
  message: string;
  /** For a version conflict: the session's head (0 when it does not exist). */
  current_version: number;
}

export type PutResult =
  | { outcome: 'response'; response: PutResponse }
  | { outcome: 'error'; error: PutError };

export interface WriteOptions {
  /** Compare-and-set: the write succeeds only if the head is this version (0: the session must not exist). */
  expectedVersion?: number | null;
  /**
   * Compare-and-set on the head's content: the write succeeds only if the head's state has this XXH3-64
   * (the `state_xxh3` of the reply that wrote it or of a get's `info`; a decimal string in
   * 0..2^64-1, or a BigInt; a Number is refused, TypeError). Else ConflictError, nothing written. Only
   * this tells the head you hold from another state at the same version (the session deleted and written
   * again); pass both. A session without versions matches no value.
   */
  expectedStateXxh3?: string | bigint | null;
  /** Idempotency key (at most 128 bytes); one is generated when absent. */
  requestId?: string;
  labels?: Record<string, string>;
  /** The registered message type the state holds (e.g. 'acme.agent.v1.State'); the session keeps it. */
  messageType?: string;
}

/** One write of putStream. */
export interface StreamPut extends WriteOptions {
  sessionId: string;
  state: Uint8Array | readonly number[];
  /** true: `state` is a MERGE patch; else the whole state (REPLACE). */
  merge?: boolean;
}

export interface ClientTLS {
  /** PEM of the CA that signed the sidecar's certificate; null: the system's. */
  rootCerts?: Buffer | null;
  /** This client's certificate chain and key (PEM), for a sidecar that requires one. */
  certChain?: Buffer | null;
  privateKey?: Buffer | null;
  /** When the certificate does not name the target's host. */
  serverName?: string;
}

export interface ClientOptions {
  /**
   * Bounds a whole call, retries included (default 30000); over 0 and at most 100 years, else a
   * RangeError when the client is made.
   */
  timeoutMs?: number;
  /**
   * UNAVAILABLE retries, backing off from 50 ms doubling to 1 s (default 8: 4.55 s of waits); a whole
   * count, or Infinity (timeoutMs alone bounds a call).
   */
  retries?: number;
  tls?: ClientTLS | null;
  /**
   * Largest message sent or taken, 1024..2^31-1; keep it equal to the sidecar's --max-message-bytes
   * (default 64 MiB).
   */
  maxMessageBytes?: number;
}

export interface SessionFilter {
  /** Only sessions carrying every one of these labels with these values. */
  labels?: Record<string, string>;
  /** Only sessions last written at or after this time. */
  updatedAfter?: Date;
  /** Only sessions last written before this time. */
  updatedBefore?: Date;
  /** Only sessions whose id starts with this string (alone: only those are read). */
  prefix?: string;
  pageSize?: number;
}

/** An event to append. */
export interface EventInput {
  /** What happened, e.g. 'tool_call': 1-128 bytes of UTF-8 without control characters. */
  type: string;
  /** Its data in any encoding; a string is sent as UTF-8. */
  payload?: Uint8Array | string;
  /** Small facts to filter by (the rules of labels). */
  attributes?: Record<string, string>;
  /** When it happened; absent: the commit's time. */
  time?: Date;
}

/** An event as read: with its number in the session's log and its time. */
export interface Event {
  type: string;
  payload: Buffer;
  attributes: Record<string, string>;
  time: Timestamp | null;
  seq: number;
}

/** The checkpoint an append writes in the same transaction as its events (its request id is the append's). */
export interface EventsPut {
  state: Uint8Array;
  /** true: `state` is a MERGE patch; else the whole state (REPLACE). */
  merge?: boolean;
  /** Compare-and-set, as for put: on a conflict (ConflictError) nothing is appended either. */
  expectedVersion?: number | null;
  /** Compare-and-set on the head's state XXH3-64, as for put. */
  expectedStateXxh3?: string | bigint | null;
  labels?: Record<string, string>;
  messageType?: string;
}

export interface AppendEventsResponse {
  /** Seq of the first event appended (0 when none was). */
  first_seq: number;
  /** Seq of the last event appended (0 when none was). */
  last_seq: number;
  /** The checkpoint's result, when `put` was sent. */
  put: PutResponse | null;
  /** An answer replayed for an earlier call with the same request id: nothing new was appended. */
  replayed: boolean;
  /** The log's last seq once the call committed (0: no event), whether or not it appended. */
  log_last_seq: number;
}

export interface EventFilter {
  /** Only events with a larger seq (default 0: from the start). */
  afterSeq?: number;
  /** Only events of one of these types (empty: every type). */
  types?: string[];
  /** Only events whose time is after this (exclusive); null or left out: no bound. */
  after?: Date | null;
  /** Only events whose time is before this (exclusive); null or left out: no bound. */
  before?: Date | null;
  /** Newest first (afterSeq still bounds from below). */
  newestFirst?: boolean;
  /** Events per page asked for (default 100, at most 1000). */
  pageSize?: number;
  /** Read on from a page's `next_page_token` (a `get`'s `events`), with the same filter. */
  pageToken?: string;
}

/** A stored blob, as ckpt.v1.ArtifactRef (put it in a Checkpoint's `artifacts`). */
export interface ArtifactRef {
  /** 'ckpt-blob:sha256:<hex>' */
  uri: string;
  /** 'sha256:<hex>' */
  content_hash: string;
  size_bytes: number;
  media_type: string;
}

/** What getBlob takes: an ArtifactRef, its uri, 'sha256:<hex>' or the 64 hex digits. */
export type BlobRef = Pick<ArtifactRef, 'uri'> | Pick<ArtifactRef, 'content_hash'> | string;

export interface PutBlobOptions {
  /** The session that references the blob: the blob is kept while one does. */
  sessionId: string;
  /** Its IANA media type, e.g. 'image/png' (at most 255 bytes). */
  mediaType?: string;
  /** The SHA-256 (64 lowercase hex digits) the bytes must have; else INVALID_ARGUMENT, nothing stored. */
  expectedSha256?: string;
  /** Bytes per message (default 1 MiB; at most maxMessageBytes - 4096). */
  chunkSizeBytes?: number;
}

export interface BlobRange {
  /** First byte (default 0). */
  offset?: number;
  /** At most this many bytes (default 0: to the end). */
  length?: number;
}

/** An error of a call: a gRPC ServiceError, with the write's request id on a put's. */
export interface CallError extends Error {
  code: number;
  details: string;
  requestId?: string;
}

/** The head moved: `expectedVersion` was not the session's head, or `expectedStateXxh3` not its state's. */
export class ConflictError extends Error {
  readonly name: 'ConflictError';
  /** 10 (ABORTED). */
  code: number;
  /** The session's head version (0 when it does not exist). */
  currentVersion: number;
  /** On an appendEvents' expectedLastSeq conflict: the event log's last seq (currentVersion is then 0). */
  lastSeq?: number;
  requestId?: string;
  constructor(message: string, currentVersion: number);
}

/** What putStream throws when it gives up. */
export interface StreamError extends CallError {
  /** Results yielded before the error. */
  answered: number;
  /**
   * The writes sent without a result (perhaps committed: the batch in flight, or those a stopping
   * sidecar did not queue), in order: copies of the writes given, each with the `requestId` it was sent
   * with (a generated one too), so `putStream(err.unanswered)` resends them as they were sent and each
   * lands once (a committed one comes back `replayed`). The writes given are not changed.
   */
  unanswered: StreamPut[];
}

export class CheckpointClient {
  /** target: "unix:/path/ckpt.sock" or "host:port". */
  constructor(target: string, options?: ClientOptions);
  put(sessionId: string, state: Uint8Array, options?: WriteOptions): Promise<PutResponse>;
  merge(sessionId: string, patch: Uint8Array, options?: WriteOptions): Promise<PutResponse>;
  /**
   * version 0 (the default) = the latest. fieldMask: only these fields of a typed session's state (paths of
   * field names, e.g. ['handoff', 'plan'], 'handoff.next'), every other one cleared.
   */
  /**
   * events: also the first page of the session's events this filter selects, read in the same call (one
   * round trip): the reply's `events`; its `next_page_token`, if not empty, is the rest (events() with the
   * same filter and it as `pageToken`).
   */
  /**
   * knownStateXxh3: the `state_xxh3` of a state the caller holds (a put's reply's, or a get's `info`'s): if
   * the version read has that state, the reply leaves it out (`state_omitted` true, `state` empty). Not with
   * fieldMask.
   */
  get(
    sessionId: string,
    version?: number,
    options?: { fieldMask?: string[]; events?: EventFilter; knownStateXxh3?: string | bigint | null },
  ): Promise<GetResponse>;
  /**
   * The result of `fn()`, the call of `tool` with `args`, recorded in the session's Checkpoint.tool_cache
   * before it resolves: a hit resolves to the recorded result without calling `fn`. An entry marked
   * is_error, holding an artifact_id or a result that is not JSON is a miss, and the record replaces it.
   * Results and arguments are JSON values; the value is the recorded JSON parsed back. Nothing is recorded
   * if `fn` throws.
   */
  cachedCall<T = unknown>(sessionId: string, tool: string, args: unknown, fn: () => T | Promise<T>): Promise<T>;
  /**
   * Every version, newest first, from `startVersion` back (0, the default: from the head). `includeStates`:
   * each VersionInfo's `state` holds that version's state, what `get` of it returns, the sidecar decoding
   * each delta chain once instead of once per version (one call per page, not a Get per version).
   */
  history(sessionId: string, options?: HistoryOptions): Promise<VersionInfo[]>;
  sessions(filter?: SessionFilter): AsyncGenerator<SessionInfo, void, undefined>;
  /**
   * Append events to the session's event log, and with `put` write a checkpoint in the same transaction.
   * Retried as put is, with one request id per call (`requestId` or a generated one): a retry appends
   * nothing twice and answers `replayed`. `expectedLastSeq`: append only if the log's last seq is this
   * (0: no event yet), else a ConflictError carrying `lastSeq`, and nothing is written.
   */
  appendEvents(
    sessionId: string,
    events: Iterable<EventInput>,
    options?: { put?: EventsPut; requestId?: string; expectedLastSeq?: number },
  ): Promise<AppendEventsResponse>;
  /** The session's events, fetched a page at a time as you iterate; rejects with NOT_FOUND for an unknown session. */
  events(sessionId: string, filter?: EventFilter): AsyncGenerator<Event, void, undefined>;
  /** copyEvents: the new session starts with a copy of the event log (seqs and times as they are). */
  fork(
    sessionId: string,
    newSessionId: string,
    options?: { version?: number; labels?: Record<string, string>; copyEvents?: boolean },
  ): Promise<SessionInfo>;
  /** Resolves to the number of versions removed (the event log goes with them). */
  delete(sessionId: string): Promise<number>;
  /**
   * Store a blob once by its SHA-256, streamed in chunks (a stream is read as it is sent, never whole).
   * Not retried, not bounded by timeoutMs; nothing is stored on an error or when `data` throws. close(),
   * or the call failing, ends it at once even while `data` waits for its next piece; `data` is then
   * stopped (a Readable destroyed, an iterator's return() called). To stop it yourself, destroy the
   * Readable: it rejects at once with the Readable's error (ERR_STREAM_PREMATURE_CLOSE without one) and
   * nothing is stored.
   */
  putBlob(
    data: Uint8Array | AsyncIterable<Uint8Array> | Iterable<Uint8Array>,
    options: PutBlobOptions,
  ): Promise<ArtifactRef>;
  /**
   * A blob's bytes (or a range) as Buffers; stopping early (a break, or destroying its Readable.from)
   * cancels the call. UNAVAILABLE (a sidecar
   * restarting) is retried as a unary read is, up to `retries` times with the same backoff, until the first
   * chunk is yielded; a failure after that is thrown (call again for the blob). Not bounded by timeoutMs.
   */
  getBlob(ref: BlobRef, range?: BlobRange): AsyncGenerator<Buffer, void, undefined>;
  /**
   * Write a blob (or a range) to the file at `file`, renamed into place once whole (a failed read leaves no
   * partial file); resolves to the bytes written. Retried as getBlob, until its first chunk is written.
   * Only close() stops it; a process killed under it leaves its hidden `.<name>.<hex>.partial` beside `file`.
   */
  getBlobToFile(ref: BlobRef, file: string, range?: BlobRange): Promise<number>;
  /**
   * Register `typeName` of a protobufjs Root (its package's file and the files it uses) so that puts can
   * name it in `messageType`; resolves to the full names of the message types registered. `fileName`: the
   * name of its package's file (default: after the package), the one other clients register it under.
   * Each file keeps its .proto's syntax (proto2 or proto3); a type from an editions file is refused.
   */
  registerType(root: import('protobufjs').Root, typeName: string, options?: { fileName?: string }): Promise<string[]>;
  /**
   * batchSize: 1..1000 (64); a batch also closes before a write that would take it past maxMessageBytes,
   * and a write too big for any message ends the writes RESOURCE_EXHAUSTED naming it, after those before.
   * Throws a TypeError/RangeError naming a bad `puts` or `batchSize` at once; writes a stopping sidecar
   * did not queue are resent on the next stream, as a broken batch is. A run of reconnects ends after
   * `retries` of them or `timeoutMs` after its first failure (so retries: Infinity still gives up),
   * throwing a StreamError. close() ends it CANCELLED (a StreamError), the writes not sent dropped.
   */
  putStream(
    puts: Iterable<StreamPut> | AsyncIterable<StreamPut>,
    options?: { batchSize?: number },
  ): AsyncGenerator<PutResult, void, undefined>;
  /**
   * Cancels the calls in flight (a putStream's too, a putBlob waiting on its data, a call waiting to
   * retry) and closes the channel: they and later calls reject CANCELLED (code 1) naming close(), at
   * once, not retried; no retry's timer is left to hold the process.
   */
  close(): void;
}

/**
 * `value` as the canonical JSON of the tool-result cache: JSON.stringify's text with object keys sorted. A
 * TypeError naming where in `value` (`path`, default "value": `value.q`, `value[2]`) a value is not JSON:
 * objects must be arrays or plain (a Map or a Set is refused, not written as `{}`), a toJSON() applied first.
 */
export function canonicalJson(value: unknown, path?: string): string;

/** The tool-result cache key of a call (hex XXH3-128 of tool, NUL, canonical arguments) and the arguments' canonical JSON. */
export function toolCacheKey(tool: string, args: unknown): { key: string; canonical: string };
