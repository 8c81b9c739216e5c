// A LangGraph.js checkpointer on the ckpt sidecar: `new CkptSaver('unix:data/ckpt.sock')`, passed to
// `graph.compile({ checkpointer })`. It lays checkpoints out as the Python saver does
// (proto/ckpt/langgraph/v1/records.proto), so either reads what the other wrote when both use the
// same serializer: a thread's namespace is one session, a checkpoint one typed Step version, written
// as a MERGE patch of what changed when it continues the head this saver last saw (of a list channel,
// the elements after those it shares with the head's), compare-and-set on that head (its version and
// its state's XXH3-64) so that two writers never fork a thread silently.
'use strict';

const { status } = require('@grpc/grpc-js');
const { BaseCheckpointSaver, TASKS, WRITES_IDX_MAP, maxChannelVersion } = require('@langchain/langgraph-checkpoint');
const { isDeepStrictEqual } = require('util');
const { CheckpointClient, ConflictError } = require('./ckpt_client');
const { LISTING_PAGE_SIZE, holdsCheckpoint, listCheckpoints } = require('./langgraph_history');
const { HEADS_REMEMBERED, afterUnanswered, keyOf, knownXxh3, needsRewrite, remember } = require('./langgraph_heads');
const { HeadStates } = require('./langgraph_states');
const r = require('./langgraph_records');
const { CheckpointConflictError, configOf, conflictError, requireThread, threadIdOf, threadOf } = require('./langgraph_threads');

const isNotFound = (err) => err && err.code === status.NOT_FOUND;

// Compare-and-set attempts of a put that starts a branch (it has no head to lose to, only to follow).
const BRANCH_ATTEMPTS = 16;

class CkptSaver extends BaseCheckpointSaver {
  // target: a sidecar ('unix:/path/ckpt.sock', 'localhost:50051'), or a CheckpointClient to use (then
  // close() leaves it open). serde: LangGraph's serializer (default JsonPlusSerializer); the other
  // options are CheckpointClient's (timeoutMs, retries, tls, maxMessageBytes).
  constructor(target, { serde, ...clientOptions } = {}) {
    super(serde);
    if (target instanceof CheckpointClient) {
      this.client = target;
      this.ownsClient = false;
    } else if (typeof target === 'string') {
      this.client = new CheckpointClient(target, clientOptions);
      this.ownsClient = true;
    } else {
      throw new TypeError('target must be a sidecar address string or a CheckpointClient');
    }
    // session id -> { version, checkpointId, lists, storedElements, writesAfterSeq, stateXxh3 }: the
    // head this saver last read or wrote (version 0 and checkpointId '' when it found the namespace
    // without any checkpoint), its list channels' element digests by channel, the list elements its
    // state holds, its Step's writes_after_seq (a read of the head asks for its pending writes with it)
    // and its state's XXH3-64 (a decimal string; '0' or none: unknown), which a put continuing it
    // expects: its version alone may be another state's, the thread deleted and written again.
    this.heads = new Map();
    // How many namespaces' heads it keeps, least recently seen out first (a head forgotten is read again).
    this.headsRemembered = HEADS_REMEMBERED;
    // Where pending writes are in a session's log (records.proto, Step.writes_after_seq): LangGraph.js
    // saves a task's writes while its checkpoint's put may not have begun. By session, the seq this
    // saver last read or appended (where the log is); by checkpoint, the seq seen before a write to it
    // that came before its put ended, and the checkpoints it put or read.
    this.lastSeq = new Map();
    this.early = new Map();
    this.known = new Map();
    // By session: the checkpoint of its last put whose call ended unanswered, and the head it was put after.
    this.unanswered = new Map();
    // The state of each head it last put or read, up to a bound in bytes: a read of that head then leaves it out.
    this.states = new HeadStates();
    this.registered = null;
  }

  // The seq just read or appended is where the log is now, so it replaces (not maxes) the one kept:
  // another saver that deleted or rebuilt the namespace began a new log, whose seqs start over. One
  // lower than the end (a slower call's answer) only makes readers of a checkpoint scan a few more.
  sawSeq(sessionId, seq) {
    this.lastSeq.set(sessionId, seq);
  }

  sawLogAtMost(sessionId, seq) {
    if (seq < (this.lastSeq.get(sessionId) || 0)) this.lastSeq.set(sessionId, seq);
  }

  sawHead(sessionId, version, step, stateXxh3) {
    const head = {
      version,
      checkpointId: step.checkpoint_id,
      lists: r.listsOf(step),
      storedElements: r.storedElements(step),
      writesAfterSeq: step.writes_after_seq,
      stateXxh3,
    };
    this.keepHead(sessionId, head);
    remember(this.known, keyOf(sessionId, step.checkpoint_id), true);
  }

  // Remembers a session's head, the least recently kept forgotten past headsRemembered.
  keepHead(sessionId, head) {
    remember(this.heads, sessionId, head, this.headsRemembered);
  }

  // What the saver knew of a session it deleted: its log starts over.
  forget(sessionId) {
    this.heads.delete(sessionId);
    this.states.forget(sessionId);
    this.lastSeq.delete(sessionId);
    for (const key of [...this.known.keys()]) if (key.startsWith(`${sessionId}\0`)) this.known.delete(key);
  }

  static fromConnString(target, options) {
    return new CkptSaver(target, options);
  }

  // Registers the Step type once per saver (a no-op on the sidecar once any client did).
  registerStep() {
    if (this.registered === null) {
      this.registered = this.client.registerType(r.records(), r.STEP_TYPE, { fileName: r.RECORDS_FILE });
      this.registered.catch(() => {
        this.registered = null;
      });
    }
    return this.registered;
  }

  async getTuple(config) {
    const { threadId, checkpointNs, checkpointId } = threadOf(config);
    if (threadId === undefined) return undefined;
    const sessionId = r.sessionIdOf(threadId, checkpointNs);
    let found;
    if (checkpointId === undefined) {
      found = await this.latest(sessionId);
    } else {
      found = await this.locate(sessionId, checkpointId);
    }
    if (found === undefined) return undefined;
    if (found.isHead) {
      const seen = this.heads.get(sessionId);
      // A head this saver did not put or read last may be another saver's in a log made anew: its
      // writes_after_seq is a seq of the log as it is.
      // Its XXH3-64 tells it from another's at the same version.
      const read = [found.version, found.step.checkpoint_id, found.stateXxh3];
      if (seen === undefined || !isDeepStrictEqual([seen.version, seen.checkpointId, seen.stateXxh3], read)) {
        this.sawLogAtMost(sessionId, found.step.writes_after_seq);
      }
      this.sawHead(sessionId, found.version, found.step, found.stateXxh3);
    } else if (found.absent) {
      // A namespace deleted and made again has a new log: its seqs start over.
      this.lastSeq.delete(sessionId);
      this.keepHead(sessionId, { version: 0, checkpointId: '', lists: new Map(), storedElements: 0 });
    }
    if (found.step === undefined) return undefined;
    remember(this.known, keyOf(sessionId, found.step.checkpoint_id), true);
    let log;
    try {
      return await this.tupleOf(threadId, checkpointNs, found.step, (afterSeq) => {
        // The writes the head's Get read, if they are the ones asked (an old format's migration reads
        // the whole log).
        const page = found.page !== undefined && found.page.afterSeq === afterSeq ? found.page : undefined;
        log = new r.LogReader(this.client, sessionId, { afterSeq, page });
        return log;
      });
    } finally {
      if (log !== undefined) {
        log.close();
        if (log.newest > 0) this.sawSeq(sessionId, log.newest);
      }
    }
  }

  // The newest checkpoint of a session not deleted: { version, step, stateXxh3, isHead, page }, { absent: true }
  // when the session does not exist, or undefined. The head this saver last saw and where its pending
  // writes begin: one Get reads the head and the writes after that seq, `page` its pending writes if
  // the head read is still that one (the Python saver's rule); else they are read after it, from the
  // Step's writes_after_seq.
  async latest(sessionId) {
    const known = this.heads.get(sessionId);
    const asked = known !== undefined && known.checkpointId ? known.writesAfterSeq : undefined;
    const { page, ...head } = (await this.read(sessionId, 0, asked, true)) || {};
    if (head.step === undefined) return { absent: true };
    const deleted = new Set(head.step.deleted_checkpoint_ids);
    if (!deleted.has(head.step.checkpoint_id)) {
      const same =
        page !== undefined &&
        known.version === head.version &&
        known.checkpointId === head.step.checkpoint_id &&
        known.stateXxh3 === head.stateXxh3 &&
        head.step.writes_after_seq === asked;
      return { ...head, isHead: true, page: same ? page : undefined };
    }
    for await (const info of this.versions(sessionId)) {
      const id = info.labels[r.ID_LABEL];
      if (id !== undefined && !deleted.has(id)) return this.read(sessionId, info.version);
    }
    return undefined;
  }

  // The version holding `checkpointId`: { version, step, stateXxh3, isHead }, or undefined.
  async locate(sessionId, checkpointId) {
    let headVersion = null;
    for await (const info of this.versions(sessionId)) {
      if (headVersion === null) headVersion = info.version;
      if (info.labels[r.ID_LABEL] !== checkpointId) continue;
      const found = await this.read(sessionId, info.version);
      if (found === undefined) return undefined;
      const deleted = info.version === headVersion ? found.step.deleted_checkpoint_ids : await this.deletedIds(sessionId);
      if (deleted.includes(checkpointId)) return undefined;
      return { ...found, isHead: info.version === headVersion };
    }
    return undefined;
  }

  // A session's versions, newest first, `pageSize` a page; none if it does not exist.
  async *versions(sessionId, pageSize = 100) {
    let token = '';
    do {
      let page;
      try {
        page = await this.client.call('ListVersions', { session_id: sessionId, page_size: pageSize, page_token: token });
      } catch (err) {
        if (isNotFound(err)) return;
        throw err;
      }
      yield* page.versions;
      token = page.next_page_token;
    } while (token);
  }

  // { version, step, stateXxh3 } of a session's version (0: the head), or undefined if there is none. With
  // `writesAfterSeq`, the same Get reads the first page of the writes events after it: `page`
  // ({ afterSeq, events, next_page_token }), none when the reply has no `events` (a sidecar from before
  // GetRequest.events read none, not an empty page). `mayOmit`: the head's state is left out of the reply
  // if it is the one this saver holds (langgraph_states.js). A head read is held.
  async read(sessionId, version, writesAfterSeq, mayOmit = false) {
    const events = writesAfterSeq === undefined ? undefined : r.LogReader.filter(writesAfterSeq);
    try {
      const knownStateXxh3 = mayOmit ? this.states.known(sessionId) : undefined;
      let got = await this.client.get(sessionId, version, { events, knownStateXxh3 });
      // Left out for the state named: the one held, also when a fold since stored it in other bytes (another
      // XXH3-64 in the reply, the same message).
      let state = got.state_omitted ? this.states.state(sessionId, knownStateXxh3) : got.state;
      if (state === undefined) {
        got = await this.client.get(sessionId, version, { events }); // left out, and not held after all
        state = got.state;
      }
      if (version === 0 && !got.state_omitted) {
        // A copy, if it is a view of the reply's whole buffer: the rest of it is not held.
        this.states.hold(sessionId, got.info.state_xxh3, state.byteLength === state.buffer.byteLength ? state : Buffer.from(state));
      }
      const found = { version: got.version, step: r.decodeStep(state), stateXxh3: got.info.state_xxh3 };
      if (events !== undefined && got.events) found.page = { afterSeq: writesAfterSeq, ...got.events };
      return found;
    } catch (err) {
      if (isNotFound(err)) return undefined;
      throw err;
    }
  }

  // The checkpoints removed from a session (by the Python saver's delete_for_runs): its head's list.
  async deletedIds(sessionId) {
    const head = await this.headIds(sessionId);
    return head ? head.deleted : [];
  }

  // { version, checkpointId, deleted, writesAfterSeq, stateXxh3 } of a session's head, or undefined when it
  // has none.
  async headIds(sessionId) {
    try {
      const fieldMask = ['checkpoint_id', 'deleted_checkpoint_ids', 'writes_after_seq'];
      const got = await this.client.get(sessionId, 0, { fieldMask });
      const step = r.decodeStep(got.state);
      const { checkpoint_id: checkpointId, deleted_checkpoint_ids: deleted, writes_after_seq: writesAfterSeq } = step;
      return { version: got.version, checkpointId, deleted, writesAfterSeq, stateXxh3: got.info.state_xxh3 };
    } catch (err) {
      if (isNotFound(err)) return undefined;
      throw err;
    }
  }

  // The CheckpointTuple of a stored Step. logFrom(afterSeq): a LogReader of the session's log able to
  // read every writes event after afterSeq. loaded: a listing's list elements read so far (loadElement).
  async tupleOf(threadId, checkpointNs, step, logFrom, loaded = undefined) {
    const checkpoint = await this.serde.loadsTyped(step.checkpoint.type, r.bytesOf(step.checkpoint));
    const elements = step.items.length > 0 ? r.elementsOf(step) : new Map();
    const channelValues = {};
    for (const channel of Object.keys(checkpoint.channel_versions || {})) {
      const value = step.channels[channel];
      if (value === undefined || value.type === r.EMPTY) continue;
      channelValues[channel] =
        value.type === r.ITEMS
          ? await Promise.all((elements.get(channel) || []).map((e, place) => this.loadElement(channel, place, e, loaded)))
          : await this.serde.loadsTyped(value.type, r.bytesOf(value));
    }
    checkpoint.channel_values = channelValues;
    const parentId = step.parent_checkpoint_id || undefined;
    // The parent's writes may be anywhere before this checkpoint's: an old format's migration reads the
    // whole log.
    const migrates = checkpoint.v < 4 && parentId !== undefined;
    const log = logFrom(migrates ? 0 : step.writes_after_seq);
    if (migrates) await this.migratePendingSends(checkpoint, parentId, log);
    const pendingWrites = await Promise.all(
      (await log.writesOf(step.checkpoint_id, step.writes_after_seq)).map(async (w) => [
        w.taskId,
        w.channel,
        await this.serde.loadsTyped(w.value.type, r.bytesOf(w.value)),
      ]),
    );
    const tuple = {
      config: configOf(threadId, checkpointNs, step.checkpoint_id),
      checkpoint,
      metadata: await this.serde.loadsTyped(step.metadata.type, r.bytesOf(step.metadata)),
      pendingWrites,
    };
    if (parentId !== undefined) tuple.parentConfig = configOf(threadId, checkpointNs, parentId);
    return tuple;
  }

  // A list element's value. With `loaded` (a Map of the elements one listing of a session read so far,
  // by channel and place), an element stored the same at the same place as one read for another
  // checkpoint is that same object: a thread's history reads each message once, not once per later
  // checkpoint. Checkpoints listed together so share the elements they have in common.
  async loadElement(channel, place, element, loaded) {
    if (loaded === undefined) return this.serde.loadsTyped(element.type, r.bytesOf(element));
    const key = `${place}:${channel}`;
    const hit = loaded.get(key);
    // The very element (Steps decoded from the bytes they added share their elements): nothing to compare.
    if (hit !== undefined && hit.element === element) return hit.value;
    const data = r.bytesOf(element);
    if (hit !== undefined && hit.type === element.type && Buffer.compare(hit.data, data) === 0) return hit.value;
    const value = await this.serde.loadsTyped(element.type, data);
    loaded.set(key, { element, type: element.type, data, value });
    return value;
  }

  // Checkpoints before format 4 kept the sends of a step as the parent's TASKS writes; LangGraph now
  // reads them from the TASKS channel.
  async migratePendingSends(checkpoint, parentId, log) {
    const sends = (await log.writesOf(parentId, 0)).filter((w) => w.channel === TASKS);
    checkpoint.channel_values[TASKS] = await Promise.all(
      sends.map((w) => this.serde.loadsTyped(w.value.type, r.bytesOf(w.value))),
    );
    const versions = Object.values(checkpoint.channel_versions);
    checkpoint.channel_versions[TASKS] = versions.length > 0 ? maxChannelVersion(...versions) : this.getNextVersion(undefined);
  }

  // Checkpoints newest first per session: of `config`'s thread (all threads without one) and
  // namespace (all without one), with an id before `before`'s, metadata matching `filter` key by key,
  // at most `limit` (langgraph_history.js).
  list(config, options = {}) {
    return listCheckpoints(this, config, options);
  }

  // `pageSize` versions of a session with their states, newest first from `startVersion`; none if the
  // session does not exist.
  async historyPage(sessionId, startVersion, pageSize) {
    try {
      return await this.client.history(sessionId, { includeStates: true, startVersion, pageSize, limit: pageSize });
    } catch (err) {
      if (isNotFound(err)) return [];
      throw err;
    }
  }

  // { sessionId, threadId, checkpointNs } of the saver's sessions of a thread (every thread when
  // undefined) and namespace (every one when undefined).
  async *sessionsOf(threadId, checkpointNs) {
    if (threadId !== undefined && checkpointNs !== undefined) {
      yield { sessionId: r.sessionIdOf(threadId, checkpointNs), threadId, checkpointNs };
      return;
    }
    if (threadId !== undefined) r.sessionIdOf(threadId, ''); // a thread id it cannot store: refused naming it
    const labels = threadId === undefined ? {} : { [r.THREAD_LABEL]: threadId };
    for await (const info of this.client.sessions({ labels })) {
      const parsed = r.parseSessionId(info.session_id);
      if (parsed === null || !(r.THREAD_LABEL in info.labels)) continue;
      if (threadId !== undefined && parsed.threadId !== threadId) continue;
      if (checkpointNs !== undefined && parsed.checkpointNs !== checkpointNs) continue;
      yield { sessionId: info.session_id, ...parsed };
    }
  }

  async put(config, checkpoint, metadata, newVersions) {
    const { threadId, checkpointNs, checkpointId: parentId } = requireThread(config, 'put');
    const sessionId = r.sessionIdOf(threadId, checkpointNs);
    const key = keyOf(sessionId, checkpoint.id);
    // Writes of this checkpoint from now on come after every seq seen; earlier ones after theirs. Kept until a
    // put of it succeeds: the same put made again, even while this one is under way, must find them.
    const writesAfterSeq = Math.min(this.early.get(key) ?? Infinity, this.lastSeq.get(sessionId) || 0);
    const where = { threadId, checkpointNs, parentId: parentId || '', sessionId };
    await this.putStep(where, checkpoint, metadata, newVersions || {}, writesAfterSeq);
    this.early.delete(key); // a write saved during the put is after the seq it stored
    this.unanswered.delete(sessionId);
    remember(this.known, key, true);
    // The caller's thread_id as given (a number stays one), as the Python savers return it.
    return configOf(config.configurable.thread_id, checkpointNs, checkpoint.id);
  }

  async putStep({ threadId, checkpointNs, parentId, sessionId }, checkpoint, metadata, newVersions, writesAfterSeq) {
    const registering = this.registerStep();
    const { channel_values: values = {}, ...rest } = checkpoint;
    // Serialized before this call's first await: LangGraph.js goes on to the next step without waiting for
    // the put, and a node changing the state in place would otherwise show in the checkpoint before it.
    const serialized = r.serializeChannels(this.serde, values, newVersions);
    const restTyped = r.handled(this.serde.dumpsTyped(rest));
    const metadataTyped = r.handled(this.serde.dumpsTyped(metadata));
    const unanswered = this.unanswered.get(sessionId);
    const seen = unanswered && unanswered.checkpointId === parentId
      ? await afterUnanswered(this, { threadId, checkpointNs, sessionId }, parentId, unanswered.head)
      : this.heads.get(sessionId);
    // The first checkpoint of a namespace this saver found empty continues that empty head too: a
    // compare-and-set on version 0 keeps a second writer from starting the same thread beside it.
    const continues = seen !== undefined && parentId === seen.checkpointId;
    const merge = continues && seen.version > 0 && !needsRewrite(seen);
    const step = {
      checkpoint_id: checkpoint.id,
      parent_checkpoint_id: parentId,
      checkpoint: r.typed(await restTyped),
      metadata: r.typed(await metadataTyped),
      channels: {},
      items: [],
      writes_after_seq: writesAfterSeq,
    };
    // The stored state's lists once this step is written.
    const lists = new Map(merge ? seen.lists : undefined);
    for (const channel of Object.keys(newVersions)) {
      lists.delete(channel);
      const value = serialized.get(channel);
      if (value === undefined) {
        step.channels[channel] = r.emptyTyped();
      } else if (value.list) {
        const elements = (await value.typed).map(r.typed);
        const digests = elements.map(r.digestOf);
        // A list the head did not hold (cut, emptied, another type) starts over at 0.
        const old = merge ? seen.lists.get(channel) : undefined;
        const start = old === undefined ? 0 : r.commonPrefix(old, digests);
        if (old === undefined || start < old.length || start < digests.length) {
          step.items.push({ channel, start, values: elements.slice(start) });
        }
        step.channels[channel] = { type: r.ITEMS, data: Buffer.alloc(0) };
        lists.set(channel, digests);
      } else {
        step.channels[channel] = r.typed(await value.typed);
      }
    }
    if (!merge && !(continues && seen.version === 0)) await this.wholeStep(sessionId, step, checkpoint, lists);
    // A head too full of cut-off elements is written whole: its deleted checkpoints with it (a branch
    // reads them below).
    if (continues && !merge && seen.version > 0) step.deleted_checkpoint_ids = await this.deletedIds(sessionId);
    const storedElements = (merge ? seen.storedElements : 0) + r.storedElements(step);
    const labels = { [r.THREAD_LABEL]: threadId, [r.ID_LABEL]: checkpoint.id };
    const runId = metadata && metadata.run_id;
    if (typeof runId === 'string' && runId && r.utf8Bytes(runId) <= r.MAX_LABEL_BYTES) labels[r.RUN_LABEL] = runId;
    await registering;
    const put = { merge, labels, messageType: r.STEP_TYPE };
    // A put whose call ended unanswered may be stored or not: a put continuing it first reads which.
    const append = (state, expected) => this.client.appendEvents(sessionId, [], { put: { ...put, state, ...expected } });
    const send = (state, expected, head) => append(state, expected)
      .catch(async (err) => {
        if (err.code !== status.FAILED_PRECONDITION) throw err;
        // Nothing was written. The likeliest cause: a sidecar that never saw the Step type, restarted on a
        // new, empty data directory after this saver registered it. Any other refusal comes back the same
        // from the second put (registering is idempotent).
        this.registered = null;
        await this.registerStep();
        return append(state, expected);
      })
      .catch((err) => {
        if (!(err instanceof ConflictError)) remember(this.unanswered, sessionId, { checkpointId: checkpoint.id, head }, HEADS_REMEMBERED);
        throw err;
      });
    const conflict = (read, currentVersion) => conflictError({ threadId, checkpointNs }, read, currentVersion);
    let reply;
    let state; // the Step as sent
    if (continues) {
      try {
        const expected = { expectedVersion: seen.version, expectedStateXxh3: knownXxh3(seen.stateXxh3) };
        state = r.encodeStep(step);
        reply = await send(state, expected, seen);
      } catch (err) {
        if (!(err instanceof ConflictError)) throw err;
        const now = await this.headIds(sessionId);
        if (now !== undefined && now.checkpointId === checkpoint.id) {
          // This put landed before, its reply lost: the head, its lists unknown (the next step writes them
          // whole), which the next put continues with compare-and-set as ever.
          const { version, writesAfterSeq, stateXxh3 } = now;
          this.keepHead(sessionId, { version, checkpointId: now.checkpointId, lists: new Map(), storedElements: 0, writesAfterSeq, stateXxh3 });
          this.states.forget(sessionId);
          return;
        }
        throw conflict(seen.version ? `checkpoint ${parentId} (version ${seen.version})` : 'it without checkpoints', err.currentVersion);
      }
    } else {
      // A branch follows the head as it is now, compare-and-set on it and with its deleted checkpoints;
      // another write landing first moves the head: read again. With no head, a log left by a deleted
      // namespace is read from its start.
      const after = step.writes_after_seq;
      for (let attempt = 1, lost; reply === undefined; attempt++) {
        if (attempt > BRANCH_ATTEMPTS) throw conflict(`its head, ${BRANCH_ATTEMPTS} times in a row,`, lost);
        const head = await this.headIds(sessionId);
        step.deleted_checkpoint_ids = head ? head.deleted : [];
        step.writes_after_seq = head ? after : 0;
        if (head && head.checkpointId === checkpoint.id) {
          // The latest checkpoint put again (a put retried): written again, its pending writes still its own.
          step.writes_after_seq = Math.min(step.writes_after_seq, head.writesAfterSeq);
        } else if (head && attempt === 1 && (await holdsCheckpoint(this, sessionId, checkpoint.id))) {
          throw new Error(
            `checkpoint ${JSON.stringify(checkpoint.id)} of thread ${JSON.stringify(threadId)} (checkpoint_ns` +
              ` ${JSON.stringify(checkpointNs)}) is stored already, and is not its latest: ckpt's saver keeps a` +
              " thread's checkpoints in the order they were put, and cannot put an earlier one again; put a new" +
              ' checkpoint (a new id) instead',
          );
        }
        const expected = { expectedVersion: head ? head.version : 0, expectedStateXxh3: head && knownXxh3(head.stateXxh3) };
        try {
          state = r.encodeStep(step);
          reply = await send(state, expected, head || { version: 0, checkpointId: '' });
        } catch (err) {
          if (!(err instanceof ConflictError)) throw err;
          lost = err.currentVersion;
        }
      }
      writesAfterSeq = step.writes_after_seq;
    }
    // The put appends no event: the reply's log_last_seq says where the log is.
    this.sawSeq(sessionId, reply.log_last_seq);
    let version = reply.put.version;
    let stateXxh3 = reply.put.state_xxh3;
    if (merge) this.states.merged(sessionId, seen.stateXxh3, state, stateXxh3);
    else this.states.hold(sessionId, stateXxh3, state);
    if (reply.log_last_seq < writesAfterSeq) {
      // The log ends before the seq the checkpoint's writes were said to follow: it is not the one this
      // saver saw (another saver deleted or rebuilt the namespace since). Its writes,
      // any already sent among them, are then found from the log's start: restated at once, with
      // compare-and-set on the head just written (lost to a newer put, it is no longer the head).
      try {
        const restate = r.encodeStep({ writes_after_seq: 0 });
        const expected = { expectedVersion: version, expectedStateXxh3: knownXxh3(stateXxh3) };
        const restated = await this.client.appendEvents(sessionId, [], {
          put: { state: restate, merge: true, ...expected, labels, messageType: r.STEP_TYPE },
        });
        this.sawSeq(sessionId, restated.log_last_seq);
        this.states.merged(sessionId, stateXxh3, restate, restated.put.state_xxh3);
        version = restated.put.version;
        stateXxh3 = restated.put.state_xxh3;
        writesAfterSeq = 0;
      } catch (err) {
        if (!(err instanceof ConflictError)) throw err;
      }
    }
    this.keepHead(sessionId, { version, checkpointId: checkpoint.id, lists, storedElements, writesAfterSeq, stateXxh3 });
  }

  // A step that does not continue the head is written whole (REPLACE): the channels it did not
  // change come from its parent (a list's elements with it).
  async wholeStep(sessionId, step, checkpoint, lists) {
    const parentId = step.parent_checkpoint_id;
    const parent = parentId ? await this.locate(sessionId, parentId) : undefined;
    if (parent !== undefined) {
      const elements = parent.step.items.length > 0 ? r.elementsOf(parent.step) : new Map();
      for (const channel of Object.keys(checkpoint.channel_versions || {})) {
        const value = parent.step.channels[channel];
        if (Object.prototype.hasOwnProperty.call(step.channels, channel) || value === undefined || value.type === r.EMPTY) {
          continue;
        }
        step.channels[channel] = value;
        if (value.type === r.ITEMS) {
          const values = elements.get(channel) || [];
          step.items.push({ channel, start: 0, values });
          lists.set(channel, values.map(r.digestOf));
        }
      }
    }
  }

  async putWrites(config, writes, taskId, taskPath = '') {
    const { threadId, checkpointNs, checkpointId } = requireThread(config, 'putWrites');
    if (checkpointId === undefined) {
      throw new Error('putWrites: the config\'s configurable has no checkpoint_id: writes belong to a checkpoint');
    }
    const sessionId = r.sessionIdOf(threadId, checkpointNs);
    const key = keyOf(sessionId, checkpointId);
    if (!this.known.has(key)) {
      // Its checkpoint's put has not begun or is under way: tell that put (or the same put made again, if
      // this one fails) where these writes are.
      remember(this.early, key, Math.min(this.early.get(key) ?? Infinity, this.lastSeq.get(sessionId) || 0));
    }
    const record = {
      checkpoint_id: checkpointId,
      task_id: taskId,
      task_path: taskPath || '',
      writes: await Promise.all(
        writes.map(async ([channel, value], i) => ({
          idx: WRITES_IDX_MAP[channel] ?? i,
          channel,
          value: r.typed(await r.dumpsNow(this.serde, value)),
        })),
      ),
    };
    const reply = await this.client.appendEvents(sessionId, [{ type: r.WRITES_EVENT, payload: r.encodeWrites(record) }]);
    this.sawSeq(sessionId, reply.last_seq);
    if (this.early.has(key)) {
      // The seq remembered may be of a log another saver deleted since: the new one's seqs start over,
      // below it. Its put's writes_after_seq must be below this write, whichever log it is in.
      this.early.set(key, Math.min(this.early.get(key), reply.first_seq - 1));
    }
  }

  // Removes every namespace of the thread: its checkpoints and writes. threadId: a string, or a number
  // (its decimal string), as a config's thread_id. A namespace holding writes and no checkpoint yet
  // (putWrites before its first put) has no labels (they come with a put): it is found by its session
  // id, in the listing of the sessions under the thread's prefix, which reads those alone.
  async deleteThread(threadId) {
    const id = threadIdOf(threadId, 'threadId');
    r.sessionIdOf(id, '', 'threadId'); // a thread id it cannot store: refused naming it
    const sessions = new Set();
    for await (const s of this.sessionsOf(id, undefined)) sessions.add(s.sessionId);
    const prefix = r.threadPrefix(id);
    for await (const info of this.client.sessions({ prefix, pageSize: LISTING_PAGE_SIZE })) {
      if (!info.session_id.startsWith(prefix)) continue; // cheap, and no other thread's session is taken
      const parsed = r.parseSessionId(info.session_id);
      if (parsed !== null && parsed.threadId === id) sessions.add(info.session_id);
    }
    for (const sessionId of sessions) {
      try {
        await this.client.delete(sessionId);
      } catch (err) {
        if (!isNotFound(err)) throw err;
      }
      this.forget(sessionId);
    }
  }

  // Closes the client this saver made (not one it was given).
  close() {
    if (this.ownsClient) this.client.close();
  }
}

module.exports = { CheckpointConflictError, CkptSaver };
