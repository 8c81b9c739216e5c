"""Quiet keyframes: a session quiet for keyframe_after_quiet_seconds gets a FULL head frame.

Its next cold read then decodes one frame, not the whole chain behind the
head. The sweep finds quiet sessions through the updated-time index, reading
only the entries between the last sweep's bound and this one's.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from ...codec import decode, keyframe
from ..config import StoreConfig
from ..errors import DataLoss
from ..storage import ReadTxn, WriteTxn
from . import keys
from .encoders import Encoders
from .layout import KEYFRAMED_BEFORE_KEY, Tables, meta_int
from .ops import Batch, Op
from .reads import chain_frames
from .records import META_LEN, printable, record, version_info

log = logging.getLogger("ckpt.store")

# Sessions read per read transaction from the updated-time index.
_CHUNK = 1000
# States one quiet-keyframe op decodes and recompresses before it yields the
# writer to the writes queued behind it.
KEYFRAME_OP_BYTES = 8 * 1024 * 1024


class QuietKeyframes:
    """The sweep's quiet keyframes, and the bound below which the updated-time index was already read."""

    def __init__(
        self,
        config: StoreConfig,
        tables: Tables,
        encoders: Encoders,
        read: Callable[[], AbstractContextManager[ReadTxn]],
        submit: Callable[[Op], Op],
    ) -> None:
        self._config = config
        self._tables = tables
        self._encoders = encoders
        self._read = read
        self._submit = submit
        # Sessions indexed as updated before this time (a granule of the
        # updated-time index) were already considered for a quiet keyframe;
        # kept in the meta table, so a restart does not read the whole index.
        self.before_nanos = meta_int(read, tables, KEYFRAMED_BEFORE_KEY)
        # Set by the writer when a write indexes below that bound (the clock stepped back).
        self._rescan = False

    def note_write(self, txn: WriteTxn, now: int) -> None:
        """A write at ``now`` (in ``txn``): one indexed below the bound makes the next sweep read it all."""
        if now < self.before_nanos:
            # The clock stepped back behind the bound: the session indexes below
            # it, where no sweep would look. The next sweep reads the whole index;
            # a restart before it must too.
            self._rescan = True
            txn.delete(KEYFRAMED_BEFORE_KEY, db=self._tables.meta)

    def sweep(self, quiet_since: int) -> int:
        """Give every session quiet since ``quiet_since`` a FULL head frame; how many were rewritten.

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
        end = keys.time_key(bound, b"")
        # A bare time prefix is no index key (each ends in a session id): the scan starts at that time.
        after = keys.time_key(0 if rescan else self.before_nanos, b"")
        written = 0
        looked = False
        while after < end:
            with self._read() as txn:
                chunk = [k for k in txn.keys_after(self._tables.updated, after, _CHUNK) if k < end]
            if not chunk:
                break
            looked = True
            sids = [key[8:] for key in chunk]
            while sids:
                done, n = self._submit(Op(self.op(sids, quiet_since))).wait()
                written += done
                sids = sids[n:]
            after = chunk[-1]
        # Never past the present (sweep(now_nanos=) may be ahead of it): a
        # session written later must index at or after the bound.
        bound = min(bound, keys.updated_granule(time.time_ns()))
        if not rescan and bound <= self.before_nanos:
            return written
        # Kept for a restart only when entries were read: an idle store does
        # not commit every sweep, and a restart rereads no more than the
        # entries since the last sweep that found any (none, unless the clock
        # stepped back: then they should be read).
        if looked or rescan:
            self._submit(self._keep_bound_op(bound)).wait()
        self.before_nanos = bound
        return written

    def _keep_bound_op(self, bound: int) -> Op:
        def apply(batch: Batch, txn: WriteTxn) -> None:
            # Not if a write since indexed below the bound (see note_write): the next sweep, or a restarted
            # store, must read the whole index.
            if not self._rescan:
                txn.put(KEYFRAMED_BEFORE_KEY, b"%d" % bound, db=self._tables.meta)

        return Op(apply)

    def op(self, sids: list[bytes], quiet_since: int) -> Callable[[Batch, WriteTxn], tuple[int, int]]:
        """Rewrite quiet sessions' DELTA/PATCH head frames as FULL frames: (rewritten, sessions looked at).

        Stops after KEYFRAME_OP_BYTES of states, so that writes queued behind
        it wait for a bounded amount of work; the sweeper submits the rest.
        """
        tables, encoders = self._tables, self._encoders

        def apply(batch: Batch, txn: WriteTxn) -> tuple[int, int]:
            written = state_bytes = looked = 0
            for sid in sids:
                if state_bytes >= KEYFRAME_OP_BYTES:
                    break
                looked += 1
                raw = txn.get(sid, db=tables.sessions)
                if raw is None:
                    continue
                session_id = printable(sid)
                try:
                    rec = record(raw)
                    head = rec.head_version
                    if rec.updated_unix_nanos >= quiet_since or not head or rec.chain_start_version == head:
                        continue  # written since, or its head is a chain start already
                    chain = chain_frames(txn, tables, sid, session_id, rec, head)
                    state = decode(chain)
                    key = keys.frame_key(sid, head)
                    value = txn.get(key, db=tables.frames)
                    if value is None:
                        raise DataLoss(f"session {session_id!r}: frame of version {head} is missing")
                    meta_end = META_LEN.size + META_LEN.unpack_from(value)[0]
                except Exception as exc:  # only reads so far: keep the session as it is (verify names damage)
                    log.warning("keyframe skipped session %r: %s", session_id, exc)
                    continue
                frame = keyframe(state, version=head, policy=self._config.chain_policy)
                new_value = value[:meta_end] + frame.data
                txn.put(key, new_value, db=tables.frames)
                rec.stored_bytes += frame.stored_bytes - (len(value) - meta_end)
                rec.chain_start_version = head
                txn.put(sid, rec.SerializeToString(), db=tables.sessions)
                # The cached encoder continues the old chain's zstd stream; the
                # session's next write must start a new one after this frame.
                # Dropped now for later writes in this batch, and again after
                # the commit: an earlier write of this batch puts its encoder
                # (the old stream's) back in the cache then.
                encoders.discard(sid)
                batch.after_commit.append(functools.partial(encoders.discard, sid))
                batch.touched_encoders.add(sid)
                info = version_info(session_id, head, new_value)
                batch.after_commit.append(functools.partial(encoders.states.restate, sid, info))
                written += 1
                state_bytes += len(state)
            return written, looked

        return apply
