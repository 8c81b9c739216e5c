// What the LangGraph.js saver remembers of the heads it saw, and its bounded caches (langgraph.js).
'use strict';

const { conflictError } = require('./langgraph_threads');

// Checkpoint ids (and ids written to before their put) the saver remembers per process.
const ID_CACHE_SIZE = 65536;
// Namespaces whose heads (each with its lists' digests) the saver remembers, least recently seen out first:
// as the Python savers.
const HEADS_REMEMBERED = 16384;
// List elements cut off (a message removed, say) a namespace's state may keep before a step is written
// whole, dropping them.
const DEAD_ELEMENTS_ALLOWED = 256;

// Whether a head's stored cut-off list elements outweigh its live ones.
function needsRewrite(head) {
  let live = 0;
  for (const digests of head.lists.values()) live += digests.length;
  return head.storedElements - live > Math.max(DEAD_ELEMENTS_ALLOWED, live);
}

// A head's state XXH3-64 to expect, or undefined when it is not known ('0': a sidecar that predates it).
const knownXxh3 = (stateXxh3) => (stateXxh3 && stateXxh3 !== '0' ? stateXxh3 : undefined);

// Sets key to value in a Map kept as a least recently set first cache of at most `size` keys.
function remember(map, key, value, size = ID_CACHE_SIZE) {
  map.delete(key);
  map.set(key, value);
  if (map.size > size) map.delete(map.keys().next().value);
}

const keyOf = (sessionId, checkpointId) => `${sessionId}\0${checkpointId}`;

// The head a put continuing parentId continues, where parentId is the checkpoint of the saver's put after
// `before` whose call ended unanswered: stored or not, only a read tells. Its head if it was stored and is
// still the head; `before` if it was not stored and nothing was put since (the put then starts a branch, as
// a put after an absent checkpoint does); otherwise another writer put after one of them, and continuing
// either would hide that write: a CheckpointConflictError.
async function afterUnanswered(saver, where, parentId, before) {
  const now = await saver.headIds(where.sessionId);
  if (now === undefined && before.version === 0) return before;
  if (now !== undefined && now.checkpointId === parentId) {
    const { version, writesAfterSeq, stateXxh3 } = now;
    return { version, checkpointId: parentId, lists: new Map(), storedElements: 0, writesAfterSeq, stateXxh3 };
  }
  if (now !== undefined && now.checkpointId === before.checkpointId && now.version === before.version) return before;
  throw conflictError(where, `checkpoint ${parentId}, whose put went unanswered,`, now ? now.version : 0);
}

module.exports = { HEADS_REMEMBERED, afterUnanswered, keyOf, knownXxh3, needsRewrite, remember };
