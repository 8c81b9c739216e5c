// What the LangGraph.js saver remembers of the heads it saw, and its bounded caches (langgraph.js).
'use strict';

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

module.exports = { HEADS_REMEMBERED, keyOf, knownXxh3, needsRewrite, remember };
