// Which versions of a thread namespace the LangGraph.js saver's `list` reads, and in which pages: the
// states come a page of the namespace's history per call (ListVersions with include_states), not a Get
// per checkpoint, read down from the newest wanted version and kept only until listed. The same rule
// as the Python saver's (sidecar/langgraph/operations.py, _States).
'use strict';

const { getCheckpointId } = require('@langchain/langgraph-checkpoint');
const { isDeepStrictEqual } = require('util');
const r = require('./langgraph_records');
const { ID_LABEL } = r;
const { threadOf } = require('./langgraph_threads');

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
    this.read = new Map(); // version -> Step, of the wanted versions read and not yet taken
    this.asked = 0; // the last page's size
  }

  // Whether `version`'s page was read: take() answers without another.
  ready(version) {
    return version > this.next;
  }

  // `version`'s Step, forgotten once taken; undefined if its page was read without it.
  take(version) {
    const step = this.read.get(version);
    this.read.delete(version);
    return step;
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
  // decoded, oldest first (r.stepsOf: each from the bytes it added to the one before), the rest dropped.
  add(startVersion, page) {
    const kept = page.filter((info) => info.version <= startVersion && this.kept.has(info.version)).reverse();
    const steps = r.stepsOf(kept.map((info) => info.state));
    kept.forEach((info, i) => this.read.set(info.version, steps[i]));
    // An empty page: none is left at or below the start (removed since the listing).
    this.next = page.length > 0 ? page[page.length - 1].version - 1 : 0;
  }
}

// `saver.list(config, options)`: checkpoints newest first per session, of `config`'s thread (all threads
// without one) and namespace (all without one), with an id before `before`'s, metadata matching `filter`
// key by key, at most `limit`. A namespace's labels say which versions are wanted; their states come a
// page of its history per call (HistoryPages), none newer than the newest wanted.
async function* listCheckpoints(saver, config, options = {}) {
  const { before, limit, filter } = options;
  const { threadId, checkpointId } = threadOf(config);
  const namespace = config && config.configurable && config.configurable.checkpoint_ns;
  const beforeId = before ? getCheckpointId(before) || undefined : undefined;
  const filtered = filter && Object.keys(filter).length > 0;
  let left = limit;
  for await (const session of saver.sessionsOf(threadId, namespace)) {
    if (left !== undefined && left <= 0) return;
    const { sessionId } = session;
    const listed = [];
    for await (const info of saver.versions(sessionId, LISTING_PAGE_SIZE)) listed.push(info);
    if (listed.length === 0) continue;
    const deleted = new Set(await saver.deletedIds(sessionId));
    const wanted = wantedVersions(listed, deleted, { checkpointId, beforeId });
    listed.length = 0;
    const pages = new HistoryPages(wanted);
    const log = new r.LogReader(saver.client, sessionId);
    const loaded = new Map(); // each list element read once (saver.loadElement)
    try {
      for (const version of wanted) {
        if (left !== undefined && left <= 0) return;
        while (!pages.ready(version)) {
          const { startVersion, pageSize } = pages.nextPage(left);
          pages.add(startVersion, await saver.historyPage(sessionId, startVersion, pageSize));
        }
        const step = pages.take(version);
        if (step === undefined) continue; // gone since the listing (the thread was deleted meanwhile)
        if (filtered) {
          const metadata = await saver.serde.loadsTyped(step.metadata.type, r.bytesOf(step.metadata));
          if (!Object.entries(filter).every(([k, v]) => isDeepStrictEqual(metadata[k], v))) continue;
        }
        if (left !== undefined) left -= 1;
        yield await saver.tupleOf(session.threadId, session.checkpointNs, step, () => log, loaded);
      }
    } finally {
      log.close();
      if (log.newest > 0) saver.sawSeq(sessionId, log.newest);
    }
  }
}

// Whether `saver`'s session holds checkpoint `checkpointId` (deleted or not): a listing of its versions.
async function holdsCheckpoint(saver, sessionId, checkpointId) {
  for await (const info of saver.versions(sessionId, LISTING_PAGE_SIZE)) {
    if (info.labels[ID_LABEL] === checkpointId) return true;
  }
  return false;
}

module.exports = { HISTORY_PAGE_SIZE, HistoryPages, LISTING_PAGE_SIZE, holdsCheckpoint, listCheckpoints, wantedVersions };
