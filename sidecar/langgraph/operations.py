"""The savers' operations, written once for the sync and the asyncio savers.

Each operation is a generator: it yields a ``Call`` (a backend method and its arguments) and is sent the
answer, or thrown the backend's exception; ``list`` also yields ``Out`` items for its caller. The savers'
drivers (savers.py) run them against a backend, blocking or awaiting.

No silent forks: a saver remembers the head it last saw of each namespace (a read of the latest checkpoint,
or its own put). A put whose parent is that head is written with compare-and-set on it, so one that lost a
race to another writer fails with CheckpointConflictError instead of hiding the other's checkpoint behind a
new branch. A put whose parent is not that head (time travel, ``update_state`` on an older checkpoint) is a
new branch on purpose, written whole.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from ckpt.langgraph.v1 import records_pb2

from .backends import HeadMoved, SeqEvents, Versions
from .calls import HEAD_MASK, MAX_EVENTS, Call, Op
from .elements import Elements
from .heads import BRANCH_MASK, CheckpointConflictError, Head, after_unanswered, head_read, keep
from .liststates import listed
from .prune import Pruning, ids_of
from .records import (
    ID_LABEL,
    PRUNING_LABEL,
    RUN_LABEL,
    WRITES_EVENT,
    Encoded,
    Where,
    WriteFold,
    decode_step,
    encode_put,
    encode_writes,
    stored_elements,
    thread_label,
    where_of,
    where_of_session,
    where_of_stage,
)
from .views import HeadViews, View, head_channels, stored_channels, view_of, view_tuple, view_written, with_writes_after

#: Compare-and-set attempts of a write that starts a branch (it has no head to lose to, only to follow).
_BRANCH_ATTEMPTS = 16
#: Namespaces whose head the saver remembers, the most recently used: a put continuing a head it forgot is
#: checked against the head it reads then, not the one its graph read.
_HEADS_REMEMBERED = 16384
#: Checkpoint ids whose version the saver remembers.
_ID_CACHE_SIZE = 65536
#: No seq yet (a bound above any).
_NO_SEQ = 2**64


#: What _head_tuple answers when it read a head without its state and cannot use the view it held.
_OMITTED = object()


def _newest_versions(versions: Versions) -> dict[str, tuple[int, dict[str, str]]]:
    out: dict[str, tuple[int, dict[str, str]]] = {}
    for version, labels in versions:  # newest first: a checkpoint delete_for_runs restated keeps its newest
        checkpoint_id = labels.get(ID_LABEL)
        if checkpoint_id is not None and checkpoint_id not in out:
            out[checkpoint_id] = (version, labels)
    return out


class Operations(Pruning):
    """The savers' state (the serializer, the heads seen, where checkpoints are) and their operations."""

    def __init__(self, serde: SerializerProtocol) -> None:
        self.serde = serde
        self._elements = Elements(serde)
        self._lock = threading.Lock()
        self._heads: OrderedDict[str, Head] = OrderedDict()
        self._ids: OrderedDict[tuple[str, str], int] = OrderedDict()
        # Where pending writes are in a session's log (see Step.writes_after_seq): the highest seq this
        # saver saw; for a checkpoint written to before its put ended, the seq seen before that write.
        self._last_seq: dict[str, int] = {}
        self._early: OrderedDict[tuple[str, str], int] = OrderedDict()
        # By session: the checkpoint of this saver's last put whose call went unanswered, and the head it was
        # put after, until a put there succeeds (heads.after_unanswered).
        self._unanswered: OrderedDict[str, tuple[str, Head]] = OrderedDict()
        # The views of the heads this saver last put or read: a read of one parses no state.
        self._views = HeadViews()

    def with_serde(self, serde: SerializerProtocol) -> Operations:
        """These operations with another serializer (a saver's ``with_allowlist`` copy), sharing what they
        remember: the heads, ids and seqs seen are the store's, whichever copy saw them."""
        clone = copy.copy(self)
        clone.serde, clone._elements = serde, Elements(serde)
        return clone

    # -- what the saver remembers ------------------------------------------------------------------

    def _saw_head(self, session_id: str, head: Head) -> None:
        with self._lock:
            keep(self._heads, session_id, head, _HEADS_REMEMBERED)
            if head.checkpoint_id is not None:
                self._remember(session_id, head.checkpoint_id, head.version)

    def _remember(self, session_id: str, checkpoint_id: str, version: int) -> None:
        # Called with the lock held.
        keep(self._ids, (session_id, checkpoint_id), version, _ID_CACHE_SIZE)

    def _saw_seq(self, session_id: str, seq: int) -> None:
        # The seq just read or appended is where the log is now, so it replaces (not maxes) the one kept:
        # another saver that deleted or rebuilt the namespace began a new log, whose seqs start over. One
        # lower than the end (a slower call's answer) only makes readers of a checkpoint scan a few more.
        with self._lock:
            self._last_seq[session_id] = seq

    def _saw_log_at_most(self, session_id: str, seq: int) -> None:
        with self._lock:
            if seq < self._last_seq.get(session_id, 0):
                self._last_seq[session_id] = seq

    def _forget(self, session_id: str) -> None:
        with self._lock:
            self._heads.pop(session_id, None)
            self._last_seq.pop(session_id, None)
            self._views.forget(session_id)
            for key in [k for k in self._ids if k[0] == session_id]:
                del self._ids[key]

    # -- reads -----------------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> Op:
        where = where_of(config)
        checkpoint_id = get_checkpoint_id(config)
        if not checkpoint_id:
            # Asked without the head's state if this saver holds its view; if that view is gone by the
            # time the reply is read (another thread's head pushed it out), asked again with it.
            got = yield from self._head_tuple(where, may_omit=True)
            if got is _OMITTED:
                got = yield from self._head_tuple(where, may_omit=False)
            return got
        found = yield from self._find(where, checkpoint_id)
        if found is None:
            return None
        view = view_of(found)
        events = yield Call("events", (where.session_id, (WRITES_EVENT,), view.writes_after_seq))
        return self._tuple(where, view, events)

    def _head_tuple(self, where: Where, *, may_omit: bool) -> Op:
        """get_tuple of the namespace's head; with ``may_omit``, the state is left out of the read if it is
        the one whose view this saver holds, and _OMITTED answers if that view cannot be used after all."""
        sid = where.session_id
        view: View | None
        with self._lock:
            known = self._heads.get(sid)
        # The head this saver last saw, and where its pending writes begin: one call reads the head and
        # them, used if the head read is still that one (else they are read after it, as below).
        asked = known.writes_after_seq if known is not None and known.checkpoint_id is not None else None
        page: SeqEvents | None = None
        token = ""
        if asked is not None:
            assert known is not None
            held = may_omit and self._views.get(sid, known.version, known.state_xxh3) is not None
            got = yield Call("get_events", (sid, (WRITES_EVENT,), asked, known.state_xxh3 if held else None))
            if got is not None:
                *got, page, token = got
        else:
            got = yield Call("get", (sid, 0, ()))
        if got is None and (yield from self._finish_prune(where)):
            got, page = (yield Call("get", (sid, 0, ()))), None
        if got is None:
            with self._lock:  # a namespace deleted and made again has a new log: its seqs start over
                self._last_seq.pop(sid, None)
            self._views.forget(sid)
            self._saw_head(sid, Head(None, 0))
            return None
        version, state, xxh3 = got
        # Left out as the state this saver named by its XXH3-64 as written, under another: a fold since stored
        # the same message in other bytes. The view and head this saver holds are this one's, under the new digest.
        if (
            state is None
            and known is not None
            and known.version == version
            and known.state_xxh3 != xxh3
            and (kept := self._views.get(sid, version, known.state_xxh3)) is not None
        ):
            self._views.put(sid, version, xxh3, kept)
            self._saw_head(sid, replace(known, state_xxh3=xxh3))
        # The view of the head this saver put or read last, if this is that head: nothing to parse.
        view, step = self._views.get(sid, version, xxh3), None
        with self._lock:
            seen = self._heads.get(sid)
        if view is not None and (
            seen is None or (seen.version, seen.checkpoint_id, seen.state_xxh3) != (version, view.checkpoint_id, xxh3)
        ):
            view = None  # a head whose other records this saver forgot: parsed, for them
        if view is None:
            if state is None:
                return _OMITTED
            step = decode_step(state)
            view = view_of(step)
            self._views.put(sid, version, xxh3, view)
        # A version's message never changes (a fold may store the head canonical since: new bytes, a new
        # xxh3, read as a head not seen), and its xxh3 tells it from another's at the same version: the
        # head this saver put (or read) is this one, digests and all, so they are not hashed again.
        if step is not None and (
            seen is None or (seen.version, seen.checkpoint_id, seen.state_xxh3) != (version, step.checkpoint_id, xxh3)
        ):
            deleted, stored = tuple(step.deleted_checkpoint_ids), stored_elements(step)
            lists = view.digests(self._elements)
            seen = Head(step.checkpoint_id, version, deleted, lists, stored, step.writes_after_seq, xxh3)
            # A head this saver did not put or read last may be another saver's in a log made anew: its
            # writes_after_seq is a seq of the log as it is.
            self._saw_log_at_most(sid, step.writes_after_seq)
        elif seen is not None and seen.writes_after_seq != view.writes_after_seq:
            seen = replace(seen, writes_after_seq=view.writes_after_seq)
        assert seen is not None  # made above unless it was this head
        self._saw_head(sid, seen)
        if (
            page is not None
            and known is not None
            and (known.version, known.checkpoint_id) == (version, view.checkpoint_id)
            and view.writes_after_seq == asked
        ):
            events = page
            if token:  # the page was cut: the rest from its token
                events = events + (yield Call("events", (sid, (WRITES_EVENT,), asked, token)))
            return self._tuple(where, view, events)
        events = yield Call("events", (sid, (WRITES_EVENT,), view.writes_after_seq))
        return self._tuple(where, view, events)

    def _tuple(self, where: Where, view: View, events: SeqEvents) -> CheckpointTuple:
        """The CheckpointTuple of ``view``, with its pending writes among ``events`` (the writes read after its
        writes_after_seq)."""
        fold = WriteFold()
        for _, _, payload in events:
            writes = records_pb2.Writes.FromString(payload)
            if writes.checkpoint_id == view.checkpoint_id:
                fold.add(writes)
        if events:
            self._saw_seq(where.session_id, events[-1][0])
        return view_tuple(self.serde, where, view, fold.pending(self.serde))

    def _find(self, where: Where, checkpoint_id: str) -> Op:
        """The Step of checkpoint ``checkpoint_id`` (None if the namespace has none, or it was deleted)."""
        sid = where.session_id
        head = yield Call("get", (sid, 0, HEAD_MASK))
        if head is None or checkpoint_id in decode_step(head[1]).deleted_checkpoint_ids:
            return None
        with self._lock:
            version = self._ids.get((sid, checkpoint_id))
        for _ in range(2):  # a remembered version may be gone (a prune rewrote the namespace): look it up
            if version is not None:
                got = yield Call("get", (sid, version, ()))
                if got is not None:
                    step = decode_step(got[1])
                    if step.checkpoint_id == checkpoint_id:
                        return step
            newest = _newest_versions((yield Call("versions", (sid,))))
            if checkpoint_id not in newest:
                return None
            version = newest[checkpoint_id][0]
            with self._lock:
                for cid, (v, _) in newest.items():
                    self._remember(sid, cid, v)
        return None

    def list(
        self,
        config: RunnableConfig | None,
        filter: Mapping[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> Op:
        configurable = (config or {}).get("configurable") or {}
        only_id = configurable.get("checkpoint_id")
        before_id = get_checkpoint_id(before) if before else None
        if config is None:
            sids = [s for s in (yield Call("sessions", ({},))) if where_of_session(s) is not None]
        elif configurable.get("checkpoint_ns") is not None:
            asked = where_of(config)
            yield from self._finish_prune(asked)
            sids = [asked.session_id]
        else:
            thread_id = str(configurable["thread_id"])
            labels = thread_label(thread_id)  # a thread id it refuses is named before any call
            for staged in (yield Call("sessions", ({PRUNING_LABEL: thread_id},))):
                where = where_of_stage(staged)
                if where is not None and where.thread_id == thread_id:
                    yield from self._finish_stage(where, staged)
            sids = yield Call("sessions", (labels,))
        candidates: list[tuple[str, int, str]] = []
        wheres: dict[str, Where] = {}
        for sid in sids:
            where = where_of_session(sid)
            if where is None:
                continue
            wheres[sid] = where
            newest = _newest_versions((yield Call("versions", (sid,))))
            if not newest:
                continue
            head = yield Call("get", (sid, 0, HEAD_MASK))
            deleted = set(decode_step(head[1]).deleted_checkpoint_ids) if head else set()
            for cid, (version, _) in newest.items():
                if cid in deleted or (only_id and cid != only_id) or (before_id and cid >= before_id):
                    continue
                candidates.append((cid, version, sid))
        return (yield from listed(self.serde, candidates, wheres, filter, limit))

    # -- writes ----------------------------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> Op:
        where = where_of(config)
        sid = where.session_id
        key = (sid, checkpoint["id"])
        with self._lock:
            seen = self._heads.get(sid)
            # Writes of this checkpoint from now on come after every seq seen; earlier ones after theirs.
            # Kept until a put of it succeeds: the same put made again, even while this one is still under
            # way (cancelled, its call not yet answered), must find the writes saved before it and during it.
            writes_after_seq = min(self._early.get(key, _NO_SEQ), self._last_seq.get(sid, 0))
            unanswered = self._unanswered.get(sid)
        parent_id = get_checkpoint_id(config)
        if unanswered is not None and unanswered[0] == parent_id:
            seen = yield from after_unanswered(where, parent_id, unanswered[1])
        done = yield from self._put(where, config, checkpoint, metadata, new_versions, seen, writes_after_seq)
        with self._lock:
            self._early.pop(key, None)  # a write saved during the put is after the seq it stored
            self._unanswered.pop(sid, None)
        # The caller's thread_id as given (an int stays one), as InMemorySaver and SqliteSaver return it.
        done["configurable"]["thread_id"] = config["configurable"]["thread_id"]
        return done

    def _put(
        self,
        where: Where,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
        seen: Head | None,
        writes_after_seq: int,
    ) -> Op:
        sid = where.session_id
        parent_id = get_checkpoint_id(config) or None
        if seen is not None and seen.checkpoint_id == parent_id:
            # The channels new_versions leaves out hold the head's values: not serialized again.
            encoded = encode_put(
                self._elements, config, checkpoint, metadata, new_versions, seen.lists, writes_after_seq,
                continues_head=True, head_elements=self._views.elements(sid, seen, self._elements),
            )  # fmt: skip
            try:
                head = yield from self._write(where, encoded, seen)
            except HeadMoved as moved:
                now = yield Call("get", (sid, 0, BRANCH_MASK))
                landed = decode_step(now[1]) if now is not None else None
                if landed is None or landed.checkpoint_id != encoded.checkpoint_id:
                    self._forget(sid)
                    raise CheckpointConflictError(where, parent_id, moved.current_version) from None
                # This put landed before, its reply lost: the head, which the next put continues with
                # compare-and-set as ever, in the same log (where this saver saw it end still holds).
                self._views.forget(sid)
                self._saw_head(sid, head_read(now[0], landed, now[2]))
                return where.config(encoded.checkpoint_id)
            self._saw_head(sid, head)
            return where.config(encoded.checkpoint_id)
        # The channels new_versions leaves out hold the parent's values as stored, not the live objects,
        # which the graph's next node may be changing in place while this put runs.
        stored = None
        if parent_id and any(k not in new_versions for k in checkpoint["channel_values"]):
            parent = yield from self._find(where, parent_id)
            stored = stored_channels(self._elements, view_of(parent)) if parent is not None else None
        encoded = encode_put(
            self._elements, config, checkpoint, metadata, new_versions, {}, writes_after_seq, stored=stored
        )
        for attempt in range(_BRANCH_ATTEMPTS):
            got = yield Call("get", (sid, 0, BRANCH_MASK))
            current = Head(None, 0)
            if got is None:  # no checkpoint yet; a log left by a deleted namespace is read from its start
                encoded.patch.writes_after_seq = 0
            else:
                step = decode_step(got[1])
                current = head_read(got[0], step, got[2])
                if step.checkpoint_id == encoded.checkpoint_id:
                    # The latest checkpoint put again (a put retried): it is written again, its pending
                    # writes still its own.
                    encoded.patch.writes_after_seq = min(encoded.patch.writes_after_seq, step.writes_after_seq)
                elif attempt == 0 and encoded.checkpoint_id in _newest_versions((yield Call("versions", (sid,)))):
                    # Stored already (deleted or not), not the latest: listed only by a put starting a branch.
                    raise ValueError(
                        f"checkpoint {encoded.checkpoint_id!r} of thread {where.thread_id!r} (checkpoint_ns"
                        f" {where.checkpoint_ns!r}) is stored already, and is not its latest: ckpt's saver keeps"
                        " a thread's checkpoints in the order they were put, and cannot put an earlier one"
                        " again; put a new checkpoint (a new id) instead"
                    )
            try:
                head = yield from self._write(where, encoded, current)
            except HeadMoved:
                continue
            self._saw_head(sid, head)
            return where.config(encoded.checkpoint_id)
        raise CheckpointConflictError(where, parent_id, 0)

    def _write(self, where: Where, encoded: Encoded, head: Head) -> Op:
        """Write ``encoded`` after ``head`` with compare-and-set on it: only what changed when it continues
        ``head``, the whole checkpoint (and the namespace's deleted ids) otherwise. The new head."""
        continues = (
            head.version > 0 and head.checkpoint_id == encoded.patch.parent_checkpoint_id and not head.needs_rewrite
        )
        if continues:
            step, labels = encoded.patch, encoded.labels
            stored = head.stored_elements + sum(len(entry.values) for entry in step.items)
        else:
            # Unchanged channels as the head stores them, not as a node may have changed them in place since.
            kept = yield from head_channels(self._views, self._elements, where.session_id, head, encoded.unchanged)
            step = encoded.full(kept)
            step.deleted_checkpoint_ids.extend(head.deleted)
            labels = {**encoded.labels, **thread_label(where.thread_id)}
            stored = sum(len(v) for v in encoded.lists.values())
        expected = (head.version, head.state_xxh3 or None)  # (head.version 0: no head, and none expected)
        # The view of what is written: the patch onto the head's view (none held: none made), or the whole.
        parent = self._views.get(where.session_id, head.version, head.state_xxh3) if continues else None
        args = (where.session_id, step.SerializeToString(), continues, *expected, labels)
        try:
            version, seq, xxh3 = yield Call("put", args)
        except HeadMoved:
            raise
        except BaseException:
            with self._lock:
                keep(self._unanswered, where.session_id, (encoded.checkpoint_id, head), _HEADS_REMEMBERED)
            raise
        self._saw_seq(where.session_id, seq)
        view = view_written(encoded, parent, step) if parent is not None or not continues else None
        writes_after_seq = step.writes_after_seq
        if seq < writes_after_seq:
            # The log ends before the seq the checkpoint's writes were said to follow: it is not the one this
            # saver saw (another saver deleted or rebuilt the namespace since). Its writes,
            # any already sent among them, are then found from the log's start: restated at once, with
            # compare-and-set on the version just written (lost to a newer put, it is no longer the head).
            restate = records_pb2.Step(writes_after_seq=0).SerializeToString()
            with contextlib.suppress(HeadMoved):
                again = (where.session_id, restate, True, version, xxh3 or None, labels)
                version, seq, xxh3 = yield Call("put", again)
                self._saw_seq(where.session_id, seq)
                writes_after_seq = 0
                view = with_writes_after(view, 0) if view is not None else None
        if view is None:
            self._views.forget(where.session_id)
        else:
            self._views.put(where.session_id, version, xxh3, view)
        return Head(encoded.checkpoint_id, version, head.deleted, encoded.lists, stored, writes_after_seq, xxh3)

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str) -> Op:
        where = where_of(config)
        checkpoint_id = get_checkpoint_id(config)
        if not checkpoint_id:
            raise ValueError('put_writes needs config["configurable"]["checkpoint_id"]: the checkpoint written to')
        payload = encode_writes(self.serde, checkpoint_id, writes, task_id, task_path)
        sid, key = where.session_id, (where.session_id, checkpoint_id)
        with self._lock:
            if key not in self._ids:
                # LangGraph saves a task's writes while its checkpoint's put may not have begun, or is under
                # way: tell that put (or the same put made again, if this one fails) where they are.
                keep(self._early, key, min(self._early.get(key, _NO_SEQ), self._last_seq.get(sid, 0)), _ID_CACHE_SIZE)
        seq = yield Call("append", (sid, [(WRITES_EVENT, payload)]))
        with self._lock:
            self._last_seq[sid] = seq  # as _saw_seq
            if key in self._early:
                # The seq remembered may be of a log another saver deleted since: the new one's seqs start
                # over, below it. Its put's writes_after_seq must be below this write, whichever log it is in.
                self._early[key] = min(self._early[key], seq - 1)

    def delete_for_runs(self, run_ids: Sequence[str]) -> Op:
        runs = set(ids_of("run_ids", "run IDs", run_ids))
        if not runs:
            return
        for sid in (yield Call("sessions", ({},))):
            if where_of_session(sid) is None:
                continue
            newest = _newest_versions((yield Call("versions", (sid,))))
            doomed = {cid for cid, (_, labels) in newest.items() if labels.get(RUN_LABEL) in runs}
            if doomed:
                yield from self._delete_checkpoints(sid, newest, doomed)

    def _delete_checkpoints(self, sid: str, newest: dict[str, tuple[int, dict[str, str]]], doomed: set[str]) -> Op:
        """Hide ``doomed`` checkpoints for good: a new version restates the newest survivor, with every
        deleted id, in one write (compare-and-set on the head, retried), so nothing is half-deleted."""
        for _ in range(_BRANCH_ATTEMPTS):
            got = yield Call("get", (sid, 0, HEAD_MASK))
            if got is None:
                return
            deleted = set(decode_step(got[1]).deleted_checkpoint_ids) | doomed
            alive = [(version, cid) for cid, (version, _) in newest.items() if cid not in deleted]
            if not alive:
                yield Call("delete", (sid,))
                self._forget(sid)
                return
            version, cid = max(alive)
            survivor = yield Call("get", (sid, version, ()))
            if survivor is None:
                return
            step = decode_step(survivor[1])
            del step.deleted_checkpoint_ids[:]
            step.deleted_checkpoint_ids.extend(sorted(deleted))
            labels = {k: v for k, v in newest[cid][1].items() if k in (ID_LABEL, RUN_LABEL)}
            try:
                args = (sid, step.SerializeToString(), False, got[0], got[2] or None, labels)
                written, _, xxh3 = yield Call("put", args)
            except HeadMoved:
                newest = _newest_versions((yield Call("versions", (sid,))))
                continue
            self._forget(sid)
            view = view_of(step)
            deleted_ids, lists, stored = tuple(sorted(deleted)), view.digests(self._elements), stored_elements(step)
            head = Head(cid, written, deleted_ids, lists, stored, step.writes_after_seq, xxh3)
            self._saw_head(sid, head)
            self._views.put(sid, written, xxh3, view)
            return

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> Op:
        target_label = thread_label(target_thread_id)
        # Into a thread with checkpoints, the copies would follow them as its newest: a history of two
        # threads whose latest is the source's, whatever their ids say.
        for sid in (yield Call("sessions", (target_label,))):
            if where_of_session(sid) is not None and (yield Call("get", (sid, 0, HEAD_MASK))) is not None:
                raise ValueError(
                    f"copy_thread: thread {target_thread_id!r} already has checkpoints; copy into a new thread,"
                    " or delete_thread it first"
                )
        for sid in (yield Call("sessions", (thread_label(source_thread_id),))):
            where = where_of_session(sid)
            if where is None:
                continue
            target = Where(target_thread_id, where.checkpoint_ns).session_id
            newest = _newest_versions((yield Call("versions", (sid,))))
            head = yield Call("get", (sid, 0, HEAD_MASK))
            deleted = set(decode_step(head[1]).deleted_checkpoint_ids) if head else set()
            payloads: dict[str, list[bytes]] = {}
            for _, _, payload in (yield Call("events", (sid, (WRITES_EVENT,), 0))):
                payloads.setdefault(records_pb2.Writes.FromString(payload).checkpoint_id, []).append(payload)
            seq = 0  # the target's log is read from its start if it had one
            for version, cid in sorted((v, c) for c, (v, _) in newest.items() if c not in deleted):
                got = yield Call("get", (sid, version, ()))
                if got is None:
                    continue
                step = decode_step(got[1])
                del step.deleted_checkpoint_ids[:]
                step.writes_after_seq = seq
                labels = {k: v for k, v in newest[cid][1].items() if k in (ID_LABEL, RUN_LABEL)} | target_label
                _, seq, _ = yield Call("put", (target, step.SerializeToString(), False, None, None, labels))
                writes = [(WRITES_EVENT, p) for p in payloads.get(cid, [])]
                for i in range(0, len(writes), MAX_EVENTS):
                    seq = yield Call("append", (target, writes[i : i + MAX_EVENTS]))
            self._forget(target)
