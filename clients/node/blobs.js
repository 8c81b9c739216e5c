// The Node.js client's blobs (artifacts stored by reference): PutBlob fed
// chunk by chunk from bytes or a stream, each chunk written out before the
// next is read (never the whole blob held), and GetBlob's chunks as an async
// iterator. As in the Python clients (sidecar/client/policy.py BlobReadAttempts)
// PutBlob is not retried (a stream may not be read twice: on UNAVAILABLE, call
// again; the same bytes land once), and a GetBlob is retried as a unary read
// (the same statuses and backoff, up to `retries`) until its first chunk
// reaches the caller, never after. Neither is bounded by timeoutMs (a 4 GiB
// blob takes longer than a call).
'use strict';

const fs = require('fs');
const path = require('path');
const crypto = require('crypto');
const { Readable } = require('stream');
const { pipeline } = require('stream/promises');
const { bytesOf, checkInt, checkString, kindOf } = require('./arguments');
const { closedError, pause, retryDelayMs } = require('./put_stream');

// Bytes per PutBlob message unless a call says otherwise.
const DEFAULT_BLOB_CHUNK_BYTES = 1024 * 1024;
// What a PutBlob message carries besides its chunk (ids, the media type): kept free of the message limit.
const ENVELOPE_BYTES = 4096;
const URI_PREFIX = 'ckpt-blob:sha256:';
const HASH = /^(?:ckpt-blob:sha256:|sha256:)?([0-9a-f]{64})$/;

// The SHA-256 (hex) `ref` names: an ArtifactRef ({ uri, content_hash }), its uri, 'sha256:<hex>' or the hex.
function blobSha256(ref) {
  let text;
  if (typeof ref === 'string') {
    text = ref;
  } else if (ref !== null && typeof ref === 'object' && (typeof ref.uri === 'string' || typeof ref.content_hash === 'string')) {
    text = typeof ref.uri === 'string' && ref.uri.startsWith(URI_PREFIX) ? ref.uri : String(ref.content_hash);
  } else {
    throw new TypeError(`ref must be an ArtifactRef ({ uri, content_hash }) or a string, not ${kindOf(ref)}`);
  }
  const found = HASH.exec(text);
  if (found === null) {
    throw new TypeError(
      `ref ${JSON.stringify(text.slice(0, 100))} names no blob: give an ArtifactRef, ${URI_PREFIX}<hex>, sha256:<hex>` +
        ' or the 64 lowercase hex digits of its SHA-256',
    );
  }
  return found[1];
}

function isStream(data) {
  return data !== null && typeof data === 'object' && (typeof data[Symbol.asyncIterator] === 'function' || typeof data[Symbol.iterator] === 'function');
}

// The iterator of a stream's pieces (null for bytes), taken here so that putBlob can stop it.
function piecesOf(data) {
  if (data instanceof Uint8Array) return null;
  return typeof data[Symbol.asyncIterator] === 'function' ? data[Symbol.asyncIterator]() : data[Symbol.iterator]();
}

// `data` cut into chunks of `size` bytes (the last shorter). A stream's pieces (read from `pieces`, its
// iterator), of any size, are copied into each chunk as they come: a source may reuse a buffer once it
// gave it, and a chunk is held across the reads that fill it.
async function* chunksOf(data, pieces, size) {
  if (pieces === null) {
    const all = bytesOf('data', data);
    for (let start = 0; start < all.length; start += size) yield all.subarray(start, start + size);
    return;
  }
  let chunk = Buffer.allocUnsafe(size);
  let filled = 0;
  for await (const piece of { [Symbol.asyncIterator]: () => pieces }) {
    if (typeof piece === 'string') {
      throw new TypeError("the blob's stream gave a string, not bytes: create it without an encoding");
    }
    let rest = bytesOf("a piece of the blob's stream", piece);
    while (rest.length > 0) {
      const taken = Math.min(size - filled, rest.length);
      rest.copy(chunk, filled, 0, taken);
      filled += taken;
      rest = rest.subarray(taken);
      if (filled === size) {
        yield chunk;
        chunk = Buffer.allocUnsafe(size);
        filled = 0;
      }
    }
  }
  if (filled > 0) yield chunk.subarray(0, filled);
}

// Stop reading a blob's source, even while a read of it is pending (then a generator's return() is
// queued behind it, so it is not awaited): a Readable is destroyed, ending that read now.
function stopSource(data, pieces) {
  if (pieces === null) return;
  if (typeof data.destroy === 'function') data.destroy();
  if (typeof pieces.return === 'function') Promise.resolve().then(() => pieces.return()).catch(() => {});
}

const ENDED = Symbol('ended');
// Sent in the stream's place when its source fails: see putBlob.

// See CheckpointClient.putBlob.
async function putBlob(stub, maxMessageBytes, data, { sessionId, mediaType = '', expectedSha256 = '', chunkSizeBytes = DEFAULT_BLOB_CHUNK_BYTES } = {}) {
  if (typeof data === 'string') {
    throw new TypeError("data must be bytes or a stream of them, not a string (a file's path? pass fs.createReadStream(path))");
  }
  if (!(data instanceof Uint8Array) && !isStream(data)) {
    throw new TypeError(`data must be a Buffer, a Uint8Array, or a Readable or (async) iterable of them, not ${kindOf(data)}`);
  }
  const first = {
    session_id: checkString('sessionId', sessionId),
    media_type: checkString('mediaType', mediaType),
    expected_sha256: checkString('expectedSha256', expectedSha256),
  };
  const chunkSize = checkInt('chunkSizeBytes', chunkSizeBytes, { low: 1, high: maxMessageBytes - ENVELOPE_BYTES });
  let call;
  const answered = new Promise((resolve, reject) => {
    call = stub.PutBlob((err, reply) => (err ? reject(err) : resolve(reply)));
  });
  answered.catch(() => {}); // awaited below; rejected early when the sidecar refuses the stream
  // The call's end comes before all is sent only with an error: stop feeding it then.
  const ended = answered.then(() => ENDED, () => ENDED);
  // Resolves once the message went out under HTTP/2 flow control: the next chunk is read only then.
  const send = (message) => Promise.race([new Promise((resolve) => call.write(message, resolve)), ended]);
  const pieces = piecesOf(data);
  const chunks = chunksOf(data, pieces, chunkSize);
  try {
    await send(first);
    for (;;) {
      // A source may wait long, or for ever: the call's end (the sidecar's error, or close() cancelling
      // it) is not waited on behind it; the source is stopped and that error thrown.
      const next = chunks.next();
      next.catch(() => {}); // a read abandoned below may fail once its source is stopped
      const step = await Promise.race([next, ended]);
      if (step === ENDED) {
        stopSource(data, pieces);
        break;
      }
      if (step.done) break;
      if ((await send({ chunk: step.value })) === ENDED) {
        await chunks.return(); // no read pending: this closes the source (a Readable is destroyed)
        break;
      }
    }
  } catch (err) {
    // The source failed: the stream ends without the `end` mark, which the sidecar takes as cut short
    // (it stores nothing); its refusal is awaited.
    call.end();
    await answered.catch(() => {});
    throw err;
  }
  await send({ end: true });
  call.end();
  const reply = await answered;
  return { uri: reply.uri || URI_PREFIX + reply.sha256, content_hash: `sha256:${reply.sha256}`, size_bytes: reply.size_bytes, media_type: mediaType };
}

function getBlobRequest(ref, { offset = 0, length = 0 } = {}) {
  return { sha256: blobSha256(ref), offset: checkInt('offset', offset), length: checkInt('length', length) };
}

// See CheckpointClient.getBlob; `request` checked by getBlobRequest. A GetBlob that fails before its first
// chunk was yielded is made again (a read before any byte is idempotent) as call() retries a unary read,
// without its deadline; once one was, its failure is thrown: a new stream would send those bytes again.
// A call close() ended, or one made after it, fails as the client's closed error, never retried.
async function* blobChunks(client, request) {
  let delivered = false;
  for (let attempt = 0; ; attempt++) {
    const call = client.stub.GetBlob(request); // a closed client's error, thrown as it is
    let done = false;
    let delayMs;
    try {
      for await (const message of call) {
        if (message.chunk.length === 0) continue;
        delivered = true;
        yield message.chunk;
      }
      done = true;
      return;
    } catch (caught) {
      const err = client.closed ? closedError() : caught;
      delayMs = delivered ? null : retryDelayMs(err, { attempt, retries: client.retries });
      if (delayMs === null) throw err;
      done = true; // the call ended: nothing to cancel
    } finally {
      if (!done) call.cancel(); // the caller stopped early, or the call failed (then this does nothing)
    }
    await pause(client, delayMs);
  }
}

// See CheckpointClient.getBlobToFile. Written beside `file` and renamed over it once whole, so a failed
// read leaves no partial file and whatever was there before untouched. A symlink is followed (the file it
// names is replaced, not the link); a path that is no regular file (/dev/null, a named pipe) is written in
// place, since renaming over it would replace a device with a file.
async function blobToFile(client, request, file) {
  checkString('file', file);
  let target = file;
  let inPlace = false;
  try {
    target = await fs.promises.realpath(file);
    inPlace = !(await fs.promises.stat(target)).isFile();
  } catch (err) {
    if (err.code !== 'ENOENT') throw err; // not there yet: made beside its name and renamed once whole
  }
  let written = 0;
  async function* counted() {
    for await (const chunk of blobChunks(client, request)) {
      written += chunk.length;
      yield chunk;
    }
  }
  if (inPlace) {
    await pipeline(Readable.from(counted(), { objectMode: false }), fs.createWriteStream(target));
    return written;
  }
  const partial = path.join(path.dirname(target), `.${path.basename(target)}.${crypto.randomBytes(6).toString('hex')}.partial`);
  try {
    await pipeline(Readable.from(counted(), { objectMode: false }), fs.createWriteStream(partial, { flags: 'wx' }));
    await fs.promises.rename(partial, target);
  } catch (err) {
    await fs.promises.rm(partial, { force: true });
    throw err;
  }
  return written;
}

module.exports = { blobChunks, blobSha256, blobToFile, getBlobRequest, putBlob, DEFAULT_BLOB_CHUNK_BYTES };
