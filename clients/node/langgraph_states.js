// The head states the LangGraph.js saver holds, so that a read of the head it last put or read names that
// state (GetRequest.known_state_xxh3) and the sidecar leaves its bytes out of the reply: resuming a thread
// then costs a Get of its pending writes, not the whole conversation again. As the Python saver's views
// (sidecar/langgraph/views.py), bounded in bytes, the least recently used out first.
'use strict';

const { xxh3 } = require('@node-rs/xxhash');

// Bytes of states held at most (as the Python savers' views).
const HEAD_STATES_BYTES = 64 << 20;

// A session's head state as the sidecar stores it: the bytes it was read as, and the MERGE patches this
// saver wrote onto it since (a MERGE stores the state followed by the patch), under the XXH3-64 the
// sidecar gave for the last of them (a decimal string). Those bytes are joined and hashed only when a
// reply leaves them out: one that does not hash to that XXH3-64 (the sidecar stored the merge compacted,
// say) is not used.
class HeadStates {
  constructor(maxBytes = HEAD_STATES_BYTES) {
    this.maxBytes = maxBytes;
    this.bytes = 0;
    this.states = new Map(); // session id -> { stateXxh3, chunks, size }
  }

  // The XXH3-64 of the state held for a session, to name in a read of its head; undefined if none is held.
  known(sessionId) {
    const held = this.states.get(sessionId);
    return held === undefined ? undefined : held.stateXxh3;
  }

  // The state held for a session if it is the one whose XXH3-64 is `stateXxh3`, else undefined (and a
  // state held that does not hash to what it was kept under is dropped).
  state(sessionId, stateXxh3) {
    const held = this.states.get(sessionId);
    if (held === undefined || held.stateXxh3 !== stateXxh3) return undefined;
    const state = held.chunks.length === 1 ? held.chunks[0] : Buffer.concat(held.chunks, held.size);
    if (xxh3.xxh64(state).toString() !== stateXxh3) {
      this.forget(sessionId);
      return undefined;
    }
    held.chunks = [state];
    this.states.delete(sessionId); // most recently used last
    this.states.set(sessionId, held);
    return state;
  }

  // Holds `state` (bytes a read gave, or a whole Step written) as a session's head under `stateXxh3`.
  hold(sessionId, stateXxh3, state) {
    this.forget(sessionId);
    if (!stateXxh3 || stateXxh3 === '0' || state.length > this.maxBytes) return;
    this.states.set(sessionId, { stateXxh3, chunks: [state], size: state.length });
    this.bytes += state.length;
    this.evict();
  }

  // A MERGE `patch` written onto the head held under `parentXxh3`, now stored under `stateXxh3`; anything
  // else held for the session is dropped (it is not the state the patch was merged onto).
  merged(sessionId, parentXxh3, patch, stateXxh3) {
    const held = this.states.get(sessionId);
    if (held === undefined || held.stateXxh3 !== parentXxh3 || !stateXxh3 || stateXxh3 === '0') {
      this.forget(sessionId);
      return;
    }
    held.chunks.push(patch);
    held.size += patch.length;
    held.stateXxh3 = stateXxh3;
    this.bytes += patch.length;
    this.evict();
  }

  forget(sessionId) {
    const held = this.states.get(sessionId);
    if (held === undefined) return;
    this.states.delete(sessionId);
    this.bytes -= held.size;
  }

  evict() {
    for (const [sessionId] of this.states) {
      if (this.bytes <= this.maxBytes) return;
      this.forget(sessionId);
    }
  }
}

module.exports = { HEAD_STATES_BYTES, HeadStates };
