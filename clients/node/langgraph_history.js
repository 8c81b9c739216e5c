// Which versions of a thread namespace the LangGraph.js saver's `list` reads, and in which pages: the
// states come a page of the namespace's history per call (ListVersions with include_states), not a Get
// per checkpoint, read down from the newest wanted version and kept only until listed. The same rule
// as the Python saver's (sidecar/langgraph/operations.py, _States).
'use strict';

const { ID_LABEL } = require('./langgraph_records');

// Versions (labels only) one page of a namespace's listing asks for.
const LISTING_PAGE_SIZE = 1000;
// Versions one page of a history with states asks for at most: what a page holds in memory.
const HISTORY_PAGE_SIZE = 100;

// The versions `list` may yield of a namespace, newest first, from its listing (`versions`: VersionInfos
// newest first) and the ids its head says were deleted: a checkpoint's newest version (one restated keeps
// its newest), not deleted, `checkpointId`'s alone when given, with an id before `beforeId` when given.
function wantedVersions(versions, deleted, { checkpointId, beforeId }) {
  const seen = new Set();
  const wanted = [];
  for (const info of versions) {
    const id = info.labels[ID_LABEL];
    if (id === undefined || seen.has(id)) continue;
    seen.add(id);
    if (deleted.has(id)) continue;
    if (checkpointId !== undefined && id !== checkpointId) continue;
    if (beforeId !== undefined && !(id < beforeId)) continue;
    wanted.push(info.version);
  }
  return wanted;
}

// The states of a namespace's wanted versions (newest first), read a page at a time: versions above the
// newest wanted one are not read, and with a limit a page ends at the version of the limit-th wanted one
// left.
class HistoryPages {
  constructor(wanted) {
    this.wanted = wanted;
    this.kept = new Set(wanted);
    // The version the next page starts at (0: none is left); those above it were read.
    this.next = wanted.length > 0 ? wanted[0] : 0;
    this.below = 0; // index in `wanted` of the first version at or below `next`
    this.read = new Map(); // version -> state, of the wanted versions read and not yet taken
    this.asked = 0; // the last page's size
  }

  // Whether `version`'s page was read: take() answers without another.
  ready(version) {
    return version > this.next;
  }

  // `version`'s state, forgotten once taken; undefined if its page was read without it.
  take(version) {
    const state = this.read.get(version);
    this.read.delete(version);
    return state;
  }

  // { startVersion, pageSize } of the next page: down to the `left`-th wanted version (all of them
  // without a limit), twice the last page at least (a filter the labels cannot answer may skip many), at
  // most HISTORY_PAGE_SIZE.
  nextPage(left) {
    const start = this.next;
    while (this.below < this.wanted.length && this.wanted[this.below] > start) this.below += 1;
    const remaining = this.wanted.length - this.below;
    const last = remaining > 0 ? this.wanted[this.below + Math.min(remaining, left || remaining) - 1] : start;
    const pageSize = Math.min(HISTORY_PAGE_SIZE, start, Math.max(start - last + 1, 2 * this.asked));
    this.asked = pageSize;
    return { startVersion: start, pageSize };
  }

  // A page (VersionInfos with states, newest first) read from `startVersion` down: the wanted states
  // kept, the rest dropped.
  add(startVersion, page) {
    for (const info of page) {
      if (info.version <= startVersion && this.kept.has(info.version)) this.read.set(info.version, info.state);
    }
    // An empty page: none is left at or below the start (removed since the listing).
    this.next = page.length > 0 ? page[page.length - 1].version - 1 : 0;
  }
}

module.exports = { HISTORY_PAGE_SIZE, HistoryPages, LISTING_PAGE_SIZE, wantedVersions };
