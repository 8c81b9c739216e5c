// putStream's machinery: one PutStream call at a time, its answers awaited
// one by one, and the loop that sends the writes of `puts` in batches across
// the streams a sidecar restart makes, resending what was not answered.
'use strict';

const grpc = require('@grpc/grpc-js');
const { checkBoolean } = require('./arguments');

// A PutResult's error code when the sidecar, stopping, did not queue the write (UNAVAILABLE).
const NOT_QUEUED = 14;

// What the sidecar answers while it restarts or shuts down (CANCELLED: a call
// it received but had not started): the same request is sent again.
const RETRYABLE = new Set([grpc.status.UNAVAILABLE, grpc.status.CANCELLED]);
// grpc-js's words when the connection closes under a call in flight (a sidecar stopping): INTERNAL,
// though the call may not have reached the sidecar at all. The sidecar's own INTERNAL errors never read
// so; a resent write carries its request id, as any retried one.
const CONNECTION_CLOSED = /RST_STREAM|Session closed/;

function retryable(err) {
  if (RETRYABLE.has(err.code)) return true;
  return err.code === grpc.status.INTERNAL && CONNECTION_CLOSED.test(err.details || err.message || '');
}

// How long to wait before retrying a call that failed with `err` after
// `attempt` retries, or null to give up: the one policy of call() and
// putStream(), as the Python clients' _retry_delay_seconds.
function retryDelayMs(err, { retry = true, attempt, retries }) {
  if (err.clientClosed) return null; // close() was called: nothing more is sent
  if (retry && retryable(err) && attempt < retries) return Math.min(50 * 2 ** attempt, 1000);
  return null;
}

// The error of a call on a closed client, or of one close() ended (`detail` says what it leaves):
// CANCELLED naming close(), as the Python clients' ClientClosedError; never retried.
function closedError(detail = '') {
  const err = new Error(`the client is closed (close() was called)${detail}; make a new CheckpointClient`);
  err.code = grpc.status.CANCELLED;
  err.details = err.message;
  err.clientClosed = true;
  return err;
}

// What a putStream that gave up leaves: `answered` writes given, `unanswered` sent without a result.
function progress(answered, unanswered) {
  if (unanswered.length === 0) return `: all ${answered} writes sent were answered`;
  return (
    `: the first ${answered} writes were answered; the next ${unanswered.length} (from requestId ` +
    `'${unanswered[0].requestId}') have no result and may have been written: resend .unanswered as they are`
  );
}

// `ms` milliseconds, or until `client` is closed (then at once, its timer cleared: it holds no process).
// Every retry's wait, so that close() ends a call waiting to retry at once.
function pause(client, ms) {
  return new Promise((resolve) => {
    if (client.closed) return resolve();
    const end = () => {
      clearTimeout(timer);
      client.onClose.delete(end);
      resolve();
    };
    const timer = setTimeout(end, ms);
    client.onClose.add(end);
  });
}

// The longest delay setTimeout keeps: over it Node fires after 1 ms.
const MAX_TIMER_MS = 2 ** 31 - 1;

// setTimeout(fn, ms) for any ms, re-armed in steps Node keeps; clear it with clearLongTimeout.
function setLongTimeout(fn, ms) {
  const until = Date.now() + ms;
  const timer = { handle: null };
  const arm = () => {
    const left = until - Date.now();
    timer.handle = left > MAX_TIMER_MS ? setTimeout(arm, MAX_TIMER_MS) : setTimeout(fn, Math.max(left, 0));
  };
  arm();
  return timer;
}

function clearLongTimeout(timer) {
  clearTimeout(timer.handle);
}

// A PutStream call whose answers are awaited one at a time: next(timeoutMs)
// resolves to the next PutStreamResponse, or rejects with the stream's error
// (the same one again after it), or DEADLINE_EXCEEDED after timeoutMs;
// endedOk: the call has ended with OK (next() then rejects INTERNAL: a sidecar
// ends a stream only once it answered every write sent, so one ending before
// is a broken contract, given up on, not retried, as the Python clients do).
function openStream(stub, target) {
  const call = stub.PutStream();
  const replies = [];
  let failure = null;
  let endedOk = false;
  let waiter = null;
  const wake = () => {
    if (waiter !== null && (replies.length || failure)) {
      const w = waiter;
      waiter = null;
      w();
    }
  };
  call.on('data', (reply) => {
    replies.push(reply);
    wake();
  });
  call.on('error', (err) => {
    failure = failure || err;
    wake();
  });
  call.on('end', () => {
    if (!failure) {
      endedOk = true;
      failure = contractError('the sidecar ended the stream (OK) before every write was sent and answered');
    }
    wake();
  });
  return {
    get endedOk() {
      return endedOk;
    },
    send(request) {
      try {
        call.write(request);
      } catch (err) {
        // The call ended already (the sidecar stopping): its error, else this one, as UNAVAILABLE.
        failure = failure || Object.assign(err, { code: grpc.status.UNAVAILABLE });
      }
    },
    async next(timeoutMs) {
      if (!replies.length && !failure) {
        let timer;
        await new Promise((resolve) => {
          waiter = resolve;
          timer = setLongTimeout(() => {
            waiter = null;
            const details = `the sidecar at ${target} did not answer within ${timeoutMs} ms`;
            failure = failure || Object.assign(new Error(`${grpc.status.DEADLINE_EXCEEDED} DEADLINE_EXCEEDED: ${details}`), {
              details,
              code: grpc.status.DEADLINE_EXCEEDED,
            });
            resolve();
          }, timeoutMs);
        });
        clearLongTimeout(timer);
      }
      if (replies.length) return replies.shift();
      throw failure;
    },
    close({ end = false } = {}) {
      // All answered: half-close, so the sidecar ends the call OK; else cancel it.
      if (end) call.end();
      else call.cancel();
    },
  };
}

function contractError(message) {
  return Object.assign(new Error(message), { code: grpc.status.INTERNAL });
}

// A result of a write the sidecar, stopping, did not queue.
function notQueued(result) {
  return result.outcome === 'error' && result.error.code === NOT_QUEUED;
}

// A write of `puts` as a PutRequest.
function streamRequest(client, put) {
  const mode = checkBoolean('merge', put.merge, false) ? 'WRITE_MODE_MERGE' : 'WRITE_MODE_REPLACE';
  const { sessionId, state, expectedVersion, requestId, labels, messageType, expectedStateXxh3 } = put;
  return client.request(sessionId, state, mode, expectedVersion, requestId, labels, messageType, expectedStateXxh3);
}

// A write of `puts` as a StreamError's `unanswered` holds it: a copy of the caller's, with the request id
// it was sent with (generated ones too), so that putStream(err.unanswered) resends it as it was sent.
function sentWrite(put, request) {
  return { ...put, requestId: request.request_id };
}

// Room in a PutStream message for its batch id and each write's tag and length (as the Python clients').
const MESSAGE_SLACK_BYTES = 64;
const PUT_FRAMING_BYTES = 8;

// How many bytes write number `index` of `puts` (a PutRequest) takes in a PutStream message of `client`:
// its serialized size (no bytes copied) and framing. A write too big for any message is refused by name.
function writeBytes(client, request, index, batchId) {
  const root = client.protoRoot;
  const PutRequest = root.lookupType('ckpt.v1.PutRequest');
  const size = PutRequest.encode(PutRequest.fromObject(request)).len + PUT_FRAMING_BYTES;
  if (size > client.maxMessageBytes - MESSAGE_SLACK_BYTES) {
    const PutStreamRequest = root.lookupType('ckpt.v1.PutStreamRequest');
    const alone = PutStreamRequest.encode(PutStreamRequest.fromObject({ puts: [request], batch_id: batchId })).len;
    if (alone > client.maxMessageBytes) {
      const message =
        `puts[${index}] (requestId '${request.request_id}') needs a ${alone}-byte PutStream message, ` +
        `over this client's message limit (maxMessageBytes = ${client.maxMessageBytes})`;
      throw Object.assign(new Error(message), {
        code: grpc.status.RESOURCE_EXHAUSTED,
        details: message,
        requestId: request.request_id,
      });
    }
  }
  return size;
}

// The results of `client`'s putStream(puts, { batchSize }), its arguments checked. A batch closes with
// `batchSize` writes, before a write that would take it past the client's maxMessageBytes (a write too
// big to share one goes alone), when no further write is ready yet, and at the end.
async function* streamPuts(client, puts, batchSize) {
  if (client.closed) throw closedError();
  const source = puts[Symbol.asyncIterator] ? puts[Symbol.asyncIterator]() : puts[Symbol.iterator]();
  const room = client.maxMessageBytes - MESSAGE_SLACK_BYTES;
  const notReady = Symbol('not ready');
  const closing = Symbol('closed');
  let onClose;
  const closed = new Promise((resolve) => {
    onClose = () => resolve(closing);
  });
  client.onClose.add(onClose);
  let pending = null; // source.next() asked and not taken yet
  // The next write: waited for (until close()), or notReady if `puts` has none ready now.
  const take = async (wait) => {
    if (pending === null) {
      pending = Promise.resolve().then(() => source.next());
      pending.catch(() => {}); // rejected while a batch is out: thrown when taken
    }
    const ways = wait ? [closed, pending] : [closed, pending, new Promise((r) => setImmediate(r, notReady))];
    const got = await Promise.race(ways);
    if (got !== notReady && got !== closing) pending = null;
    return got;
  };
  let stream = null;
  let batchId = 0;
  let answered = 0;
  let taken = 0; // writes taken from `puts`
  let carried = null; // { request, write, size }: a write the last batch had no room for, the next one's first
  let failed = null; // what `puts` threw
  // close() was called: the writes not sent are dropped, `unanswered` those sent without a result.
  const closedNow = (unanswered) => Object.assign(closedError(` during putStream${progress(answered, unanswered)}`), {
    answered,
    unanswered,
  });
  try {
    while (failed === null || carried !== null) {
      let batch = []; // PutRequests
      let writes = []; // each one's write, as sentWrite() gives it
      let bytes = 0;
      if (carried !== null) {
        batch.push(carried.request);
        writes.push(carried.write);
        bytes = carried.size;
        carried = null;
      }
      while (failed === null && batch.length < batchSize) {
        if (client.closed) throw closedNow([]);
        let next;
        try {
          next = await take(batch.length === 0);
        } catch (err) {
          failed = { err };
          break;
        }
        if (next === closing) throw closedNow([]);
        if (next === notReady) break;
        if (next.done) {
          failed = { done: true };
          break;
        }
        let request;
        let size;
        try {
          // A bad argument is refused by name (and the write's index), and ends the writes as an error of
          // `puts` would.
          try {
            request = streamRequest(client, next.value);
          } catch (err) {
            err.message = `puts[${taken}]: ${err.message}`;
            throw err;
          }
          size = writeBytes(client, request, taken, batchId + 1);
        } catch (err) {
          failed = { err };
          break;
        } finally {
          taken += 1;
        }
        const write = sentWrite(next.value, request);
        if (batch.length > 0 && bytes + size > room) {
          carried = { request, write, size };
          break;
        }
        batch.push(request);
        writes.push(write);
        bytes += size;
      }
      if (batch.length === 0) break;
      // A run of failures (reconnects since the last answer) ends after `retries` reconnects, or
      // `timeoutMs` after its first failure (as a unary call's retries, and the Python clients' runs).
      let attempt = 0;
      let giveUpAt = null;
      let sent = false; // the batch went out on a stream: its writes may be written
      for (;;) {
        try {
          if (client.closed) throw closedError();
          if (stream === null) stream = openStream(client.stub, client.target);
          batchId += 1;
          stream.send({ puts: batch, batch_id: batchId });
          sent = true;
          const reply = await stream.next(client.timeoutMs);
          if (reply.batch_id !== batchId || reply.results.length !== batch.length) {
            throw contractError(`batch ${batchId} was answered by batch ${reply.batch_id}'s results`);
          }
          // A sidecar stopped while the stream waited for room in its write queue answers the
          // batch whole, the writes it had not queued UNAVAILABLE (not written), and ends the
          // stream: they are the batch's last results. Those are held back until the stream
          // ends: broken, their writes are resent first on the next one, request ids the same;
          // ended OK, they are given as they are (as the Python clients' ledger does).
          let given = reply.results.length;
          while (given > 0 && notQueued(reply.results[given - 1])) given -= 1;
          if (given > 0) {
            attempt = 0;
            giveUpAt = null;
          }
          answered += given;
          yield* reply.results.slice(0, given);
          if (given === batch.length) break;
          const held = reply.results.slice(given);
          batch = batch.slice(given);
          writes = writes.slice(given);
          stream.close({ end: true }); // nothing more is sent on it: how it ends says which
          const end = await stream.next(client.timeoutMs).then(
            () => contractError('PutStream answered a batch that was not sent'),
            (err) => err,
          );
          if (!stream.endedOk) throw end;
          stream = null;
          answered += held.length;
          yield* held;
          break;
        } catch (err) {
          if (stream !== null) stream.close();
          stream = null;
          if (client.closed) throw closedNow(sent ? writes : []);
          if (giveUpAt === null) giveUpAt = Date.now() + client.timeoutMs;
          const delayMs = retryDelayMs(err, { attempt, retries: client.retries });
          attempt += 1;
          if (delayMs === null || Date.now() + delayMs >= giveUpAt) {
            err.answered = answered;
            err.unanswered = writes;
            throw err;
          }
          await pause(client, delayMs);
        }
      }
    }
    if (failed !== null && failed.err !== undefined) throw failed.err;
  } finally {
    client.onClose.delete(onClose);
    if (stream !== null) stream.close({ end: true });
  }
}

module.exports = { closedError, pause, retryDelayMs, streamPuts };
