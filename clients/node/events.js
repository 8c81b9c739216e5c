// The requests of the Node.js client's event log methods (appendEvents and
// events), checked as the Python clients check theirs (sidecar/client/events.py).
'use strict';

const { bytesOf, checkBoolean, checkFixed64, checkInt, checkString, kindOf, newRequestId, stringMap, timestamp } = require('./arguments');

// The sidecar's limits (service.proto): events per append, events per page.
const MAX_EVENTS_PER_APPEND = 1000;
const MAX_PAGE_SIZE = 1000;

// { type, payload, attributes, time } as a ckpt.v1.Event; payload: bytes, or a string sent as UTF-8.
function eventOf(name, e) {
  if (e === null || typeof e !== 'object' || Array.isArray(e)) {
    throw new TypeError(`${name} must be an object { type, payload, attributes, time }, not ${kindOf(e)}`);
  }
  const message = { type: checkString(`${name}.type`, e.type), attributes: stringMap(`${name}.attributes`, e.attributes) };
  if (typeof e.payload === 'string') message.payload = Buffer.from(checkString(`${name}.payload`, e.payload), 'utf8');
  else if (e.payload !== undefined) message.payload = bytesOf(`${name}.payload`, e.payload);
  if (e.time !== undefined) message.time = timestamp(`${name}.time`, e.time);
  return message;
}

// The PutRequest of an append's `put`: { state, merge, expectedVersion, expectedStateXxh3, labels,
// messageType }. Its request
// id is the append's (the sidecar ignores the put's own), so it carries none.
function putOf(sessionId, put) {
  if (typeof put !== 'object' || Array.isArray(put)) {
    throw new TypeError(
      `put must be an object { state, merge, expectedVersion, expectedStateXxh3, labels, messageType }, not ${kindOf(put)}`,
    );
  }
  const request = {
    session_id: sessionId,
    state: bytesOf('put.state', put.state),
    mode: checkBoolean('put.merge', put.merge, false) ? 'WRITE_MODE_MERGE' : 'WRITE_MODE_REPLACE',
    labels: stringMap('put.labels', put.labels),
    message_type: put.messageType === undefined || put.messageType === null ? '' : checkString('put.messageType', put.messageType),
  };
  if (put.expectedVersion !== undefined && put.expectedVersion !== null) request.expected_version = checkInt('put.expectedVersion', put.expectedVersion);
  if (put.expectedStateXxh3 !== undefined && put.expectedStateXxh3 !== null) {
    request.expected_state_xxh3 = checkFixed64('put.expectedStateXxh3', put.expectedStateXxh3);
  }
  return request;
}

function appendEventsRequest(sessionId, events, { put, requestId, expectedLastSeq } = {}) {
  checkString('sessionId', sessionId);
  if (events === null || typeof events !== 'object' || typeof events[Symbol.iterator] !== 'function') {
    throw new TypeError(`events must be an array of { type, payload, attributes, time }, not ${kindOf(events)}`);
  }
  const listed = Array.from(events);
  if (listed.length > MAX_EVENTS_PER_APPEND) {
    throw new RangeError(`events has ${listed.length} entries; the sidecar takes at most ${MAX_EVENTS_PER_APPEND} per append`);
  }
  const request = {
    session_id: sessionId,
    events: listed.map((e, i) => eventOf(`events[${i}]`, e)),
    // Generated when not given, as for put; one per call, sent again unchanged on every retry, so a
    // retry after a lost reply appends nothing twice.
    request_id: (requestId === undefined || requestId === null ? '' : checkString('requestId', requestId)) || newRequestId(),
  };
  if (put !== undefined && put !== null) request.put = putOf(sessionId, put);
  if (expectedLastSeq !== undefined && expectedLastSeq !== null) request.expected_last_seq = checkInt('expectedLastSeq', expectedLastSeq);
  return request;
}

function readEventsRequest(sessionId, { afterSeq = 0, types = [], after, before, newestFirst = false, pageSize = 100, pageToken = '' } = {}) {
  if (typeof types === 'string') throw new TypeError(`types must be an array of strings, not a string: pass ['${types}'] for one type`);
  if (!Array.isArray(types)) throw new TypeError(`types must be an array of strings, not ${kindOf(types)}`);
  const request = {
    session_id: checkString('sessionId', sessionId),
    after_seq: checkInt('afterSeq', afterSeq),
    types: types.map((t, i) => checkString(`types[${i}]`, t)),
    newest_first: checkBoolean('newestFirst', newestFirst),
    page_size: checkInt('pageSize', pageSize, { high: MAX_PAGE_SIZE }),
    page_token: checkString('pageToken', pageToken),
  };
  if (after !== undefined && after !== null) request.after = timestamp('after', after);
  if (before !== undefined && before !== null) request.before = timestamp('before', before);
  return request;
}

// CheckpointClient.events: the pages of `request` (from readEventsRequest), each asked for as the last is used up.
async function* eventPages(client, request) {
  do {
    const page = await client.call('ReadEvents', request);
    yield* page.events;
    request.page_token = page.next_page_token;
  } while (request.page_token);
}

module.exports = { appendEventsRequest, eventPages, readEventsRequest, MAX_EVENTS_PER_APPEND };
