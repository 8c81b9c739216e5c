"""Quiet sweeps: a session quiet for a while gets its head rewritten so that its next cold read decodes one frame.

Two of them, each with its own quiet period and bound: folds (fold_after_quiet_seconds,
folds.py: a PATCH head's run becomes PREFIX frames and a FULL head, fewer bytes) and
keyframes (keyframe_after_quiet_seconds: a head that is not folded, a DELTA, becomes a FULL
frame of its state). A sweep finds quiet sessions through the updated-time index, reading only
the entries between the last sweep's bound and this one's.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from ckpt.store.v1 import records_pb2

from ...codec import FrameKind, decode, frame_kind, keyframe
from ..config import StoreConfig
from ..errors import Unavailable
from ..storage import ReadTxn, WriteTxn
from . import keys
from .encoders import Encoders
from .folds import Plan, Resolve, Rewrite, Work, fold_reads, sealed_again, stored
from .layout import FOLDED_BEFORE_KEY, KEYFRAMED_BEFORE_KEY, Tables, meta_int, stamp_new_frames
from .ops import Batch, Op
from .reads import chain_frames
from .records import printable, record, version_info

log = logging.getLogger("ckpt.store")

# Sessions read per read transaction from the updated-time index.
_CHUNK = 1000
# States one quiet-sweep plan decodes and recompresses (off the writer) before its rewrites are written.
QUIET_OP_BYTES = 8 * 1024 * 1024


class QuietSweep:
    """One quiet sweep, the folds' or the keyframes' (the defaults): its rewrite (``plan``), and the bound
    below which the updated-time index was already read (kept under ``bound_key``)."""

    def __init__(
        self,
        config: StoreConfig,
        tables: Tables,
        encoders: Encoders,
        read: Callable[[], AbstractContextManager[ReadTxn]],
        submit: Callable[[Op], Op],
        *,
        bound_key: bytes = KEYFRAMED_BEFORE_KEY,
        plan: Plan | None = None,
    ) -> None:
        self._config = config
        self._tables = tables
        self._encoders = encoders
        self._read = read
        self._submit = submit
        self._bound_key = bound_key
        self._plan: Plan = plan or self._keyframe
        # Sessions indexed as updated before this time (a granule of the
        # updated-time index) were already considered; kept in the meta
        # table, so a restart does not read the whole index.
        self.before_nanos = meta_int(read, tables, bound_key)
        # Set by the writer when a write indexes below that bound (the clock stepped back).
        self._rescan = False

    def note_write(self, txn: WriteTxn, now: int) -> None:
        """A write at ``now`` (in ``txn``): one indexed below the bound makes the next sweep read it all."""
        if now < self.before_nanos:
            # The clock stepped back behind the bound: the session indexes below
            # it, where no sweep would look. The next sweep reads the whole index;
            # a restart before it must too.
            self._rescan = True
            txn.delete(self._bound_key, db=self._tables.meta)

    def sweep(self, quiet_since: int) -> int:
        """Rewrite the head of every session quiet since ``quiet_since``; how many were rewritten.

        Only the updated-time index entries between the last sweep's bound and
        this one's are read: a session written since moved its entry past the
        bound, and comes up again once it is quiet again. The bound is kept in
        the meta table, so a restarted store goes on from it (sessions that
        went quiet while it was down are past it); the first sweep of a store
        that never swept reads the whole index. Sessions already ending in a
        FULL frame cost a record read each.
        """
        bound = keys.updated_granule(quiet_since)  # entries below it were all updated before quiet_since
        # The wall clock stepped back: sessions written since index below the
        # last bound and would be skipped. Read the whole index again, as the
        # first sweep of a new store does. A step no sweep sees (shorter than
        # the sweep interval) is caught by the writes it makes (note_write).
        rescan = self._rescan or bound < self.before_nanos
        self._rescan = False
        written, looked, _ = self._scan(rescan, keys.time_key(bound, b""), quiet_since, self._submit, None)
        self._advance(bound, rescan=rescan, looked=looked, submit=self._submit)
        return written

    def sweep_all(self, *, seconds: float, submit: Callable[[Op], Op]) -> tuple[int, bool]:
        """Rewrite the head of every session written since the bound, as a sweep would once they are quiet
        (Store.close: no write comes after), for at most about ``seconds`` (it stops between ops, each
        QUIET_OP_BYTES of work at most); how many were rewritten, and whether the time ran out first.
        Only a sweep that ran to the end, and rewrote something, moves the bound: a close that finds
        nothing to rewrite commits nothing."""
        deadline = time.monotonic() + seconds
        now = time.time_ns()
        rescan = self._rescan
        self._rescan = False
        written, looked, done = self._scan(rescan, None, keys.MAX_TIME_NANOS, submit, deadline)
        if done and written:
            self._advance(keys.updated_granule(now), rescan=rescan, looked=looked, submit=submit)
        else:
            self._rescan = self._rescan or rescan
        return written, not done

    def _scan(
        self,
        rescan: bool,
        end: bytes | None,
        quiet_since: int,
        submit: Callable[[Op], Op],
        deadline: float | None,
    ) -> tuple[int, bool, bool]:
        """Rewrite the quiet sessions the index holds from the bound (``rescan``: from the start) to ``end``
        (None: its end): how many were rewritten, whether any entry was read, and whether it got to ``end``."""
        # A bare time prefix is no index key (each ends in a session id): the scan starts at that time.
        after = keys.time_key(0 if rescan else self.before_nanos, b"")
        written = 0
        looked = False
        while end is None or after < end:
            with self._read() as txn:
                chunk = [k for k in txn.keys_after(self._tables.updated, after, _CHUNK) if end is None or k < end]
            if not chunk:
                break
            looked = True
            sids = [key[8:] for key in chunk]
            while sids:
                if deadline is not None and time.monotonic() >= deadline:
                    return written, looked, False
                planned, n = self.plan(sids, quiet_since)
                if planned:
                    written += submit(Op(self.op(planned))).wait()
                sids = sids[n:]
            after = chunk[-1]
        return written, looked, True

    def _advance(self, bound: int, *, rescan: bool, looked: bool, submit: Callable[[Op], Op]) -> None:
        # Never past the present (sweep(now_nanos=) may be ahead of it): a
        # session written later must index at or after the bound.
        bound = min(bound, keys.updated_granule(time.time_ns()))
        if not rescan and bound <= self.before_nanos:
            return
        # Kept for a restart only when entries were read: an idle store does
        # not commit every sweep, and a restart rereads no more than the
        # entries since the last sweep that found any (none, unless the clock
        # stepped back: then they should be read).
        if looked or rescan:
            submit(self._keep_bound_op(bound)).wait()
        self.before_nanos = bound

    def _keep_bound_op(self, bound: int) -> Op:
        def apply(batch: Batch, txn: WriteTxn) -> None:
            # Not if a write since indexed below the bound (see note_write): the next sweep, or a restarted
            # store, must read the whole index.
            if not self._rescan:
                txn.put(self._bound_key, b"%d" % bound, db=self._tables.meta)

        return Op(apply)

    def _keyframe(self, txn: ReadTxn, sid: bytes, session_id: str, rec: records_pb2.SessionRecord) -> Work:
        """Read the frames the head is read through: :data:`~.folds.Plan` of a FULL frame of the head's state
        in place of its DELTA or PATCH frame (a PATCH head is left to the fold while folding is on)."""
        chain = chain_frames(txn, self._tables, sid, session_id, rec, rec.head_version)
        return functools.partial(self._keyframe_plan, sid, session_id, rec.head_version, chain)

    def _keyframe_plan(self, sid: bytes, session_id: str, head: int, chain: list[memoryview]) -> Rewrite | None:
        kind = frame_kind(chain[-1])
        if self._config.fold_after_quiet_seconds is not None and kind is FrameKind.PATCH:
            return None  # folded (folds.py): fewer bytes than a keyframe, and as fast to read
        if kind is FrameKind.FULL:  # a MERGE write's keyframe, its stream open
            return sealed_again(self._config.chain_policy, sid, session_id, head, chain[-1])
        state = decode(chain)
        key, value, meta_end = stored(chain[-1], sid, head)
        frame = keyframe(state, version=head, policy=self._config.chain_policy)
        new_value = value[:meta_end] + frame.data
        return Rewrite([(key, new_value)], frame.stored_bytes - (len(value) - meta_end), len(state))

    def plan(self, sids: list[bytes], quiet_since: int) -> tuple[list[Planned], int]:
        """The rewrites of the quiet sessions among ``sids``, worked out on the caller's thread from a read
        transaction each: (planned, sessions looked at).

        Decoding a head and compressing it again take time in proportion to its state (a 150 MB head:
        seconds): done here rather than in the writer's transaction, where every other session's writes
        would wait for it. Stops after QUIET_OP_BYTES of states, which bounds what the plans hold in memory.
        """
        planned: list[Planned] = []
        state_bytes = looked = 0
        for sid in sids:
            if state_bytes >= QUIET_OP_BYTES:
                break
            looked += 1
            session_id = printable(sid)
            try:
                with self._read() as txn:  # one a session, ended before the work: see folds.Plan
                    raw = txn.get(sid, db=self._tables.sessions)
                    if raw is None:
                        continue
                    raw = bytes(raw)
                    rec = record(raw)
                    head = rec.head_version
                    if rec.updated_unix_nanos >= quiet_since or not head:
                        continue  # written since
                    if rec.chain_start_version == head and rec.open_keyframe_version != head:
                        continue  # a chain start already, sealed (or a REPLACE session's FULL frame)
                    work = self._plan(txn, sid, session_id, rec)
                rewrite = work()
            except Unavailable:
                raise  # the store is closing
            except Exception as exc:  # nothing written: keep the session as it is (verify names damage)
                log.warning("quiet rewrite skipped session %r: %s", session_id, exc)
                continue
            if rewrite is not None:
                planned.append(Planned(sid, session_id, raw, rewrite))
                state_bytes += rewrite.cost
        return planned, looked

    def op(self, planned: list[Planned]) -> Callable[[Batch, WriteTxn], int]:
        """Write the planned rewrites (:meth:`plan`) of the sessions whose record is still the one they were
        planned from: how many were written.

        Every change to a session's frames (a write, retention, a delete, another rewrite) rewrites its
        record in the same transaction, so an unchanged record means unchanged frames; a session that
        moved on is left for a later sweep, once it is quiet again.
        """
        tables, encoders = self._tables, self._encoders

        def apply(batch: Batch, txn: WriteTxn) -> int:
            written = 0
            stamped = False
            for p in planned:
                now = txn.get(p.sid, db=tables.sessions)
                if now is None or bytes(now) != p.raw:
                    continue
                rec, rewrite = record(p.raw), p.rewrite  # parsed anew: a batch may run again (a map grown)
                for key, new_value in rewrite.puts:
                    txn.put(key, new_value, db=tables.frames)
                if not stamped:  # PREFIX frames, and sealed FULL frames (keyframe()): both layout 7
                    stamp_new_frames(txn, tables)
                    stamped = True
                rec.stored_bytes += rewrite.stored_delta
                rec.chain_start_version = rec.head_version
                rec.open_keyframe_version = 0  # sealed now, if it was the head
                txn.put(p.sid, rec.SerializeToString(), db=tables.sessions)
                # The cached encoder continues the old chain's zstd stream; the
                # session's next write must start a new one after this frame.
                # Dropped now for later writes in this batch, and again after
                # the commit, whatever encoder a write of this batch put back.
                encoders.discard(p.sid)
                batch.after_commit.append(functools.partial(encoders.discard, p.sid))
                batch.touched_encoders.add(p.sid)
                info = version_info(p.session_id, rec.head_version, rewrite.puts[-1][1])  # the head's new value
                restate = functools.partial(encoders.states.restate, p.sid, info, state=rewrite.head_state)
                batch.after_commit.append(restate)
                written += 1
            return written

        return apply


@dataclass(frozen=True, slots=True)
class Planned:
    """A session's rewrite, planned (QuietSweep.plan) from the record ``raw`` that it is written against."""

    sid: bytes
    session_id: str
    raw: bytes
    rewrite: Rewrite


class QuietSweeps:
    """The store's two quiet sweeps, a QuietSweep each (folds first, then keyframes), and what every write
    tells them."""

    def __init__(
        self,
        config: StoreConfig,
        tables: Tables,
        encoders: Encoders,
        read: Callable[[], AbstractContextManager[ReadTxn]],
        submit: Callable[[Op], Op],
        resolve: Resolve,
    ) -> None:
        self._config = config
        self.keyframes = QuietSweep(config, tables, encoders, read, submit)
        self.folds = QuietSweep(
            config,
            tables,
            encoders,
            read,
            submit,
            bound_key=FOLDED_BEFORE_KEY,
            plan=functools.partial(fold_reads, tables, config.chain_policy, resolve),
        )

    def note_write(self, txn: WriteTxn, now: int) -> None:
        self.folds.note_write(txn, now)
        self.keyframes.note_write(txn, now)

    def sweep(self, now: int) -> tuple[int, int]:
        """The folds and the keyframes of the sessions quiet as of ``now``: (heads folded, keyframes written)."""
        config = self._config
        folded = written = 0
        if config.fold_after_quiet_seconds is not None:
            folded = self.folds.sweep(now - int(config.fold_after_quiet_seconds * 1e9))
        if config.keyframe_after_quiet_seconds is not None:
            written = self.keyframes.sweep(now - int(config.keyframe_after_quiet_seconds * 1e9))
        return folded, written

    def fold_at_close(self, submit: Callable[[Op], Op]) -> None:
        """Fold the heads of the sessions written since the fold sweep's bound, within fold_on_close_seconds
        (Store.close, between its last write and the writer's end); logged."""
        seconds = self._config.fold_on_close_seconds
        if self._config.fold_after_quiet_seconds is None or not seconds:
            return
        t0 = time.monotonic()
        try:
            folded, stopped = self.folds.sweep_all(seconds=seconds, submit=submit)
        except Unavailable:  # writes stopped (an I/O error): what is not folded stays a chain
            return
        except Exception:  # the close goes on: unfolded heads are chains, read as before
            log.exception("folding heads at close failed")
            return
        if folded or stopped:
            log.info(
                "folded %d quiet heads at close (%.2f s)%s",
                folded,
                time.monotonic() - t0,
                f"; stopped at fold_on_close_seconds ({seconds:g} s): the rest stay chains" if stopped else "",
            )
