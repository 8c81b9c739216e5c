// Types of ckpt_client.js. Messages keep the proto's field names (proto-loader
// keepCase), 64-bit integers are Numbers and enums their names as strings.

export type FrameKind = 'FRAME_KIND_UNSPECIFIED' | 'FRAME_KIND_FULL' | 'FRAME_KIND_DELTA' | 'FRAME_KIND_PATCH';
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
}

export interface GetResponse {
  version: number;
  state: Buffer;
  info: VersionInfo | null;
  /** The message type the state holds, if that version was written typed; '' for opaque bytes. */
  message_type: string;
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

/** A PutRequest as sent (request_id filled in when none was given). */
export interface PutRequest {
  session_id: string;
  state: Buffer;
  mode: WriteMode;
  expected_version?: number;
  request_id: string;
  labels: Record<string, string>;
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
  expectedVersion?: number;
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
  /** Bounds a whole call, retries included (default 30000). */
  timeoutMs?: number;
  /** UNAVAILABLE retries, backing off from 50 ms doubling to 1 s (default 8: 4.55 s of waits). */
  retries?: number;
  tls?: ClientTLS | null;
  /** Largest message sent or taken; keep it equal to the sidecar's --max-message-bytes (default 64 MiB). */
  maxMessageBytes?: number;
}

export interface SessionFilter {
  /** Only sessions carrying every one of these labels with these values. */
  labels?: Record<string, string>;
  /** Only sessions last written at or after this time. */
  updatedAfter?: Date;
  /** Only sessions last written before this time. */
  updatedBefore?: Date;
  pageSize?: number;
}

/** An error of a call: a gRPC ServiceError, with the write's request id on a put's. */
export interface CallError extends Error {
  code: number;
  details: string;
  requestId?: string;
}

/** The head moved: `expectedVersion` was not the session's head. */
export class ConflictError extends Error {
  readonly name: 'ConflictError';
  /** 10 (ABORTED). */
  code: number;
  /** The session's head version (0 when it does not exist). */
  currentVersion: number;
  requestId?: string;
  constructor(message: string, currentVersion: number);
}

/** What putStream throws when it gives up. */
export interface StreamError extends CallError {
  /** Results yielded before the error. */
  answered: number;
  /** The batch sent without a result (perhaps committed), with its request ids: resend as is. */
  unanswered: PutRequest[];
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
  get(sessionId: string, version?: number, options?: { fieldMask?: string[] }): Promise<GetResponse>;
  /**
   * The result of `fn()`, the call of `tool` with `args`, recorded in the session's Checkpoint.tool_cache
   * before it resolves: a hit resolves to the recorded result without calling `fn`. Results and
   * arguments are JSON values; the value is the recorded JSON parsed back. Nothing is recorded if `fn`
   * throws.
   */
  cachedCall<T = unknown>(sessionId: string, tool: string, args: unknown, fn: () => T | Promise<T>): Promise<T>;
  /** Every version, newest first. */
  history(sessionId: string): Promise<VersionInfo[]>;
  sessions(filter?: SessionFilter): AsyncGenerator<SessionInfo, void, undefined>;
  fork(
    sessionId: string,
    newSessionId: string,
    options?: { version?: number; labels?: Record<string, string> },
  ): Promise<SessionInfo>;
  /** Resolves to the number of versions removed. */
  delete(sessionId: string): Promise<number>;
  /**
   * Register `typeName` of a protobufjs Root (its package's file and the files it uses) so that puts can
   * name it in `messageType`; resolves to the full names of the message types registered.
   */
  registerType(root: import('protobufjs').Root, typeName: string): Promise<string[]>;
  putStream(
    puts: Iterable<StreamPut> | AsyncIterable<StreamPut>,
    options?: { batchSize?: number },
  ): AsyncGenerator<PutResult, void, undefined>;
  close(): void;
}

/** `value` as the canonical JSON of the tool-result cache: JSON.stringify's text with object keys sorted. */
export function canonicalJson(value: unknown): string;

/** The tool-result cache key of a call (hex XXH3-128 of tool, NUL, canonical arguments) and the arguments' canonical JSON. */
export function toolCacheKey(tool: string, args: unknown): { key: string; canonical: string };
