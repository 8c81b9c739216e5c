"""Removing threads and pruning them, for the savers' operations (operations.py): ``delete_thread``,
``prune`` and the move a prune stopped half-way leaves for the next read to finish."""

from __future__ import annotations

from collections.abc import Sequence

from langgraph.checkpoint.serde.base import SerializerProtocol

from ckpt.langgraph.v1 import records_pb2

from .calls import HEAD_MASK, MAX_EVENTS, Call, Op
from .records import (
    ID_LABEL,
    PRUNING_LABEL,
    RUN_LABEL,
    WRITES_EVENT,
    Where,
    decode_step,
    delta_channels_rebuilt,
    thread_label,
    thread_prefix,
    where_of_session,
)


class Pruning:
    """The operations that remove threads or prune them (a base of Operations)."""

    serde: SerializerProtocol

    def _forget(self, session_id: str) -> None:
        """What the saver remembers of a session it deleted: Operations forgets it."""
        raise NotImplementedError

    def delete_thread(self, thread_id: str) -> Op:
        yield from self.delete_threads([thread_id])

    def delete_threads(self, thread_ids: Sequence[str]) -> Op:
        """Delete every session of the threads: their prunes' stages and namespaces (found by label), and
        the namespaces holding writes and no checkpoint yet (put_writes before the first put: a session's
        labels come with a put, so these have none and are found by their session id, in the listing of
        the sessions under the thread's prefix, which reads those alone: a thread's sessions, not all)."""
        doomed: dict[str, None] = {}
        for thread_id in thread_ids:
            for labels in ({PRUNING_LABEL: thread_id}, thread_label(thread_id)):
                doomed.update(dict.fromkeys((yield Call("sessions", (labels,)))))
            prefix = thread_prefix(thread_id)
            for sid in (yield Call("sessions", ({}, prefix))):
                # Checked here too: a session of another thread is never taken for this one's (the
                # thread id's length in the prefix keeps one thread's prefix from starting another's).
                if sid.startswith(prefix):
                    doomed[sid] = None
        for sid in doomed:
            yield Call("delete", (sid,))
            self._forget(sid)

    def prune(self, thread_ids: Sequence[str], strategy: str) -> Op:
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f'strategy must be "keep_latest" or "delete", not {strategy!r}')
        thread_ids = ids_of("thread_ids", "thread IDs", thread_ids)
        if strategy == "delete":
            yield from self.delete_threads(thread_ids)
            return
        namespaces: dict[str, list[Where]] = {}
        for thread_id in thread_ids:
            sids = yield Call("sessions", (thread_label(thread_id),))
            namespaces[thread_id] = [w for w in map(where_of_session, sids) if w is not None]
        refused = []  # checked first, so that a refusal prunes nothing
        for thread_id, wheres in namespaces.items():
            for where in wheres:
                got = yield Call("get", (where.session_id, 0, ("metadata",)))
                if got is not None and delta_channels_rebuilt(self.serde, decode_step(got[1])):
                    refused.append(thread_id)
                    break
        if refused:
            raise _delta_refusal(refused)
        for wheres in namespaces.values():
            for where in wheres:
                yield from self._keep_latest(where)

    def _keep_latest(self, where: Where) -> Op:
        """Rewrite a namespace as its newest checkpoint and that checkpoint's writes. The checkpoint is
        staged in a session of its own first, so that a crash half-way loses nothing: the next read of the
        namespace finishes the move (``_finish_prune``)."""
        sid, staging = where.session_id, where.pruning_session_id
        versions = yield Call("versions", (sid,))
        if len(versions) <= 1:
            return
        got = yield Call("get", (sid, 0, ()))
        if got is None:
            return
        step = decode_step(got[1])
        if delta_channels_rebuilt(self.serde, step):  # since the check: the thread's namespaces before it pruned
            raise _delta_refusal([where.thread_id])
        del step.deleted_checkpoint_ids[:]
        cid = step.checkpoint_id
        labels = {k: v for k, v in versions[0][1].items() if k in (ID_LABEL, RUN_LABEL)}
        events = yield Call("events", (sid, (WRITES_EVENT,), step.writes_after_seq))
        writes = [(t, p) for _, t, p in events if records_pb2.Writes.FromString(p).checkpoint_id == cid]
        step.writes_after_seq = 0  # the stage's log holds them alone
        yield Call("delete", (staging,))  # a stage a crash left behind while the namespace was whole
        staged = {**labels, PRUNING_LABEL: where.thread_id}
        yield Call("put", (staging, step.SerializeToString(), False, 0, None, staged))
        for i in range(0, len(writes), MAX_EVENTS):
            yield Call("append", (staging, writes[i : i + MAX_EVENTS]))
        yield Call("delete", (sid,))
        self._forget(sid)
        yield from self._finish_stage(where, staging)

    def _finish_prune(self, where: Where) -> Op:
        """Move a staged namespace into place if its session is gone (a prune stopped half-way);
        whether one was. Its stage is Where.pruning_session_id: the longer name wherever it fits the
        session-id limit (as every saver before the shorter one named its stages), else the shorter."""
        return (yield from self._finish_stage(where, where.pruning_session_id))

    def _finish_stage(self, where: Where, staging: str) -> Op:
        sid = where.session_id
        versions = yield Call("versions", (staging,))
        if not versions or (yield Call("get", (sid, 0, HEAD_MASK))) is not None:
            return False  # nothing staged, or a prune under way (it removes its stage itself)
        labels = {k: v for k, v in versions[0][1].items() if k in (ID_LABEL, RUN_LABEL)}
        yield Call("fork", (staging, sid, {**labels, **thread_label(where.thread_id)}))
        yield Call("delete", (staging,))
        return True


def ids_of(name: str, what: str, ids: Sequence[str]) -> list[str]:
    """``ids`` as strings; a str refused, as PostgresSaver refuses it: its characters are not the ids meant."""
    if isinstance(ids, str):
        raise TypeError(f"{name} must be a sequence of {what}, not a str")
    return [str(i) for i in ids]


def _delta_refusal(thread_ids: Sequence[str]) -> NotImplementedError:
    return NotImplementedError(
        f"prune(strategy='keep_latest') refused threads {', '.join(map(repr, thread_ids))}: a DeltaChannel of"
        " their latest checkpoint is rebuilt from older checkpoints and their writes, which the prune would"
        " drop (emptying the channel); nothing of these threads was pruned. Prune them when their latest"
        " checkpoint holds a delta snapshot of every DeltaChannel, or use strategy='delete'."
    )
