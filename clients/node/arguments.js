// The Node.js client's arguments, refused here by name before anything is
// sent (as sidecar/client/arguments.py does for the Python clients), and the
// request ids its writes carry.
'use strict';

const crypto = require('crypto');

// A fresh request id: a UUIDv7 (RFC 9562) as 32 hex digits, the time in ms
// first. Time-ordered ids keep the store's records of writes made together on
// the same few pages (sidecar/keys.py); random ones cost a page each.
function newRequestId() {
  const bytes = crypto.randomBytes(16);
  bytes.writeUIntBE(Date.now(), 0, 6);
  bytes[6] = (bytes[6] & 0x0f) | 0x70; // version 7
  bytes[8] = (bytes[8] & 0x3f) | 0x80; // variant 0b10
  return bytes.toString('hex');
}

function kindOf(value) {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  if (typeof value === 'object') return value.constructor ? value.constructor.name : 'an object';
  return typeof value;
}

// A Date as a google.protobuf.Timestamp.
function timestamp(name, date) {
  if (!(date instanceof Date) || Number.isNaN(date.getTime())) {
    throw new TypeError(`${name} must be a valid Date, not ${date}`);
  }
  const seconds = Math.floor(date.getTime() / 1000);
  return { seconds, nanos: (date.getTime() - seconds * 1000) * 1e6 };
}

// A string that is text: a lone surrogate would be sent as U+FFFD, naming something else.
function checkString(name, value) {
  if (typeof value !== 'string') throw new TypeError(`${name} must be a string, not ${kindOf(value)}`);
  if (!value.isWellFormed()) throw new TypeError(`${name} holds a lone surrogate, which is not text`);
  return value;
}

// A boolean; an optional one (`absent` given) is `absent` when undefined or null. A string or an object
// would otherwise be taken as true ('false' too).
function checkBoolean(name, value, absent) {
  if (absent !== undefined && (value === undefined || value === null)) return absent;
  if (typeof value !== 'boolean') throw new TypeError(`${name} must be a boolean, not ${kindOf(value)}`);
  return value;
}

// A whole Number in low..high: 64-bit fields are sent as Numbers, exact below 2^53.
function checkInt(name, value, { low = 0, high = Number.MAX_SAFE_INTEGER } = {}) {
  if (!Number.isSafeInteger(value)) {
    // A string shown quoted: '"3"' is not the number 3 it would print as.
    const shown = typeof value === 'string' ? JSON.stringify(value) : value;
    throw new TypeError(`${name} must be a whole Number, not ${shown}`);
  }
  if (value < low || value > high) throw new RangeError(`${name} must be in ${low}..${high}, got ${value}`);
  return value;
}

// The largest fixed64.
const UINT64_MAX = (1n << 64n) - 1n;

// A fixed64 (an XXH3-64: a state_xxh3) as the decimal string the client returns them as, from that
// string or a BigInt in 0..2^64-1. A Number is refused: most 64-bit hashes are over 2^53, where a Number
// holds another value.
function checkFixed64(name, value) {
  let n;
  if (typeof value === 'bigint') {
    n = value;
  } else if (typeof value === 'string') {
    if (!/^[0-9]+$/.test(value)) throw new TypeError(`${name} must be a string of decimal digits, not ${JSON.stringify(value)}`);
    n = BigInt(value);
  } else {
    const what =
      typeof value === 'number' ? `a Number (${value}): a 64-bit hash is mostly over 2^53, where Numbers are not exact` : kindOf(value);
    throw new TypeError(`${name} must be a decimal string (a state_xxh3 as the client returns it) or a BigInt, not ${what}`);
  }
  if (n < 0n || n > UINT64_MAX) throw new RangeError(`${name} must be in 0..${UINT64_MAX}, got ${value}`);
  return n.toString();
}

// Bytes as a Buffer over the same memory (a Uint8Array is not copied).
function bytesOf(name, value) {
  if (Buffer.isBuffer(value)) return value;
  if (value instanceof Uint8Array) return Buffer.from(value.buffer, value.byteOffset, value.byteLength);
  throw new TypeError(`${name} must be a Buffer or a Uint8Array, not ${kindOf(value)}`);
}

// A write's state: bytes, or an array of byte values (putStream's writes, as the declarations allow).
function stateBytes(name, value) {
  if (!Array.isArray(value)) return bytesOf(name, value);
  for (const [i, b] of value.entries()) {
    if (!Number.isInteger(b) || b < 0 || b > 255) {
      throw new TypeError(`${name}[${i}] must be a byte value 0..255, not ${typeof b === 'number' ? b : kindOf(b)}`);
    }
  }
  return Buffer.from(value);
}

function stringMap(name, value) {
  if (value === undefined || value === null) return {};
  // A Map (or any object not made by {} or Object.create(null)) would read as no entries at all.
  const proto = typeof value === 'object' ? Object.getPrototypeOf(value) : undefined;
  if (typeof value !== 'object' || (proto !== Object.prototype && proto !== null)) {
    throw new TypeError(`${name} must be an object of strings, not ${kindOf(value)}`);
  }
  for (const [key, v] of Object.entries(value)) {
    checkString(`${name} key ${JSON.stringify(key)}`, key);
    checkString(`${name}[${JSON.stringify(key)}]`, v);
  }
  return value;
}

module.exports = { bytesOf, checkBoolean, checkFixed64, checkInt, checkString, kindOf, newRequestId, stateBytes, stringMap, timestamp };
