"""Folding a quiet session's head run: its PATCH head as a FULL frame, each version before it in the run as a
header-only PREFIX frame.

A MERGE session's head is a chain: a FULL (or DELTA) frame, then PATCH frames, each appending its patch to
the state before. Every version of that run has a state that is a prefix of the head's, so the run is
stored as the head's state in one FULL frame and, for each earlier version, "my state is the first N bytes
of the head's" (codec.prefix_frame): fewer bytes than the patches' frames, and a cold read of the head
decodes one frame. Nothing is rewritten unless every version's checksum, as its old frame records it,
matches the prefix's: that is what proves the run is one of prefixes. Run by the fold sweep
(keyframes.QuietSweep, fold_after_quiet_seconds) and at Store.close (fold_on_close_seconds).

A typed session's head state holds every patch of the run, fields a later one overwrote included (an entry
edited in place, a file rewritten): the bytes the next cold read decodes, sends and parses. When its type's
canonical serialization (codec.compact) is much smaller, the fold stores the head as that, and the run's
earlier versions as prefixes of the version before the head (their state's bytes unchanged). The head's
VersionRecord keeps the XXH3-64 its state had (written_state_xxh3): a write holding it still passes its
expected_state_xxh3 check, as one holding the new state's does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from google.protobuf.message import Message

from ckpt.store.v1 import records_pb2

from ...codec import (
    ChainPolicy,
    DecodeError,
    EncodeError,
    FrameHeader,
    FrameKind,
    compact,
    decode,
    frame_kind,
    keyframe,
    parse,
    prefix_frame,
)
from ..errors import DataLoss
from ..storage import ReadTxn
from . import keys
from .layout import Tables
from .reads import chain_frames
from .records import META_LEN, version_record

#: A MERGE write's keyframe (a FULL frame starting a chain, its zstd stream left open) of a state smaller than
#: this is sealed once quiet (:func:`sealed_again`): a cold read of it then skips a stream's window and
#: bookkeeping, a third of the read of a state of a few KB. A larger state's read is mostly its decode, and
#: sealing it would decode and compress it whole.
SEAL_BELOW_BYTES = 128 * 1024

#: A fold stores a typed head as its canonical serialization when that is at most this fraction of the
#: head's bytes. Such a fold keeps one FULL frame more (the version before the head's, for the run's
#: prefixes), so it pays where a head carries much that was overwritten: measured on `ckpt bench run`'s
#: folded heads (their bytes over their canonical ones), coding 1.74-2.67x, factual a median of 1.42x (up to
#: 3.2x), chat at most 1.31x, trajectories a median of 1.02x.
COMPACT_FOLD_MAX_FRACTION = 0.75


#: A run onto a sealed FULL frame (an earlier fold's) whose head state is at least the chain policy's
#: ``segment_min_state_bytes`` is folded again only if its chain, by the policy's estimate of decode cost
#: (the bytes the run added and ``frame_cost_bytes`` a frame), costs at least this fraction of its state
#: more to decode than the state alone. A fold decodes the head, compresses it again and writes it whole:
#: for a 150 MB head with a few KB patched on, ~75 MB written (and seconds of CPU) to spare a cold read a
#: fraction of a percent, after every quiet period. A run onto any other frame is folded: one sealed frame
#: decodes in one shot (the `large` workload's multi-MB heads read cold in 45 ms folded, 95 ms as chains).
#: Below ``segment_min_state_bytes`` a fold is cheap and a chain's per-frame cost is what a cold read pays.
FOLD_MIN_GAIN_FRACTION = 1 / 8


def worth_folding(policy: ChainPolicy, *, run_frames: int, added: int, state: int) -> bool:
    """Whether a quiet run of ``run_frames`` PATCH frames that added ``added`` bytes to a head of ``state``
    bytes is worth folding (FOLD_MIN_GAIN_FRACTION)."""
    if state < policy.segment_min_state_bytes:
        return True
    return added + run_frames * policy.frame_cost_bytes >= FOLD_MIN_GAIN_FRACTION * state


@dataclass(frozen=True, slots=True)
class Rewrite:
    """What a quiet sweep writes for one session: new values of its frames (the head's among them), all in
    one transaction with its record."""

    #: (frame key, new value) for each frame rewritten, the head's last.
    puts: list[tuple[bytes, bytes]]
    #: How many bytes the session's frames grow by (< 0: shrink).
    stored_delta: int
    #: The state bytes decoded and recompressed for it (what QUIET_OP_BYTES counts).
    cost: int
    #: The head's state as it now reads, when the rewrite changed its bytes (a compacted head); else None.
    head_state: bytes | None = None


#: A typed session's message class by its type's name (None: not known here).
Resolve = Callable[[str], type[Message] | None]
#: Works a session's rewrite out (None: nothing to rewrite), from what a read took.
Work = Callable[[], "Rewrite | None"]
#: Reads what a session's rewrite needs (txn, sid, session id, record), and returns the work of it, to be
#: done once the read transaction has ended: a long one would keep LMDB from reusing the pages every
#: commit meanwhile frees (a 150 MB head's fold takes seconds).
Plan = Callable[[ReadTxn, bytes, str, records_pb2.SessionRecord], Work]


def stored(frame: memoryview, sid: bytes, version: int) -> tuple[bytes, bytes, int]:
    """The frame key, stored value and metadata's end of a frame that a chain read took (records.frame_of:
    a view of its value, read as bytes)."""
    value = frame.obj
    assert isinstance(value, bytes)
    return keys.frame_key(sid, version), value, len(value) - len(frame)


def fold_reads(
    tables: Tables,
    policy: ChainPolicy,
    resolve: Resolve,
    txn: ReadTxn,
    sid: bytes,
    session_id: str,
    rec: records_pb2.SessionRecord,
) -> Work:
    """Read the session's chain, every version from its start (a fold rewrites each): :data:`Plan`."""
    chain = chain_frames(txn, tables, sid, session_id, rec, rec.head_version, consecutive=True)
    return functools.partial(fold_plan, policy, resolve, sid, session_id, rec, chain)


def fold_plan(
    policy: ChainPolicy,
    resolve: Resolve,
    sid: bytes,
    session_id: str,
    rec: records_pb2.SessionRecord,
    chain: list[memoryview],
) -> Rewrite | None:
    """The fold of the session's head run (None if its head is not a PATCH frame, or not worth folding),
    from its chain as read (every version from the chain's start), with no transaction; a FULL head (the
    sweep passes one only if its stream is open) written again sealed, a run of one."""
    head = rec.head_version
    base = head - len(chain) + 1  # chain[0]'s version
    kinds = [_kind(frame, session_id, base + i) for i, frame in enumerate(chain)]
    if kinds[-1] is FrameKind.FULL:  # a MERGE write's keyframe, its stream open (open_keyframe_version)
        return sealed_again(policy, sid, session_id, head, chain[-1])
    if kinds[-1] is not FrameKind.PATCH:
        return None  # a DELTA head: a quiet keyframe's, if they are on
    first = len(chain) - 1
    while first > 0 and kinds[first - 1] is FrameKind.PATCH:
        first -= 1
    if first == 0:  # chain_frames starts at a FULL frame: a PATCH there is damage
        raise DataLoss(f"session {session_id!r}: no FULL frame starts the chain of version {head}")
    start = head - (len(chain) - first)  # the run's FULL or DELTA frame: its state is the run's first
    headers = [_header(chain[version - base], session_id, version) for version in range(start, head + 1)]
    state_size, onto = headers[-1].state_size, headers[0]  # the head's, and the frame the run starts from
    added = state_size - onto.state_size
    if onto.sealed and not worth_folding(policy, run_frames=head - start, added=added, state=state_size):
        return None
    state = decode(chain)  # checked against the head's state_size and XXH3-64
    # What compaction drops is mostly what the run's patches added (a typed chain start is stored compacted):
    # a run that added less than it could drop is not parsed (a 23 MB head with a few KB patched on: 84 ms).
    canonical = (
        _canonical(state, rec.message_type, resolve) if added >= (1 - COMPACT_FOLD_MAX_FRACTION) * len(state) else None
    )
    # The version the run's earlier versions are prefixes of, and its state: the head's, or (a compacted
    # head) the version's before it, whose frame is kept as it is if it starts the run.
    top, top_state = (head, state) if canonical is None else (head - 1, state[: headers[-2].state_size])
    puts: list[tuple[bytes, bytes]] = []
    delta = 0
    for version in range(start, top):
        key, value, meta_end = stored(chain[version - base], sid, version)
        old = headers[version - start]
        try:
            frame = prefix_frame(top_state, version=version, source_version=top, state_size=old.state_size)
        except ValueError as exc:
            raise DataLoss(f"session {session_id!r} version {version}: {exc}; not folded") from None
        if frame.header.state_xxh3 != old.state_xxh3:
            raise DataLoss(
                f"session {session_id!r} version {version}: its state is not the first {old.state_size} bytes of"
                f" version {top}'s (XXH3-64 {frame.header.state_xxh3:016x}, its frame says"
                f" {old.state_xxh3:016x}); not folded"
            )
        puts.append((key, value[:meta_end] + frame.data))
        delta += frame.stored_bytes - (len(value) - meta_end)
    if top != head and top > start:  # a compacted head: the version before it holds the run's state
        key, value, meta_end = stored(chain[top - base], sid, top)
        full = keyframe(top_state, version=top, policy=policy)
        puts.append((key, value[:meta_end] + full.data))
        delta += full.stored_bytes - (len(value) - meta_end)
    key, value, meta_end = stored(chain[-1], sid, head)
    if canonical is None:
        meta = value[:meta_end]
        full = keyframe(state, version=head, policy=policy)
    else:
        record = version_record(session_id, head, value)
        record.written_state_xxh3 = headers[-1].state_xxh3
        raw = record.SerializeToString()
        meta = META_LEN.pack(len(raw)) + raw
        full = keyframe(canonical, version=head, policy=policy)
    puts.append((key, meta + full.data))
    delta += full.stored_bytes - (len(value) - meta_end)
    cost = len(state) if canonical is None else len(state) + len(top_state) + len(canonical)
    return Rewrite(puts, delta, cost, canonical)


def sealed_again(policy: ChainPolicy, sid: bytes, session_id: str, head: int, frame: memoryview) -> Rewrite | None:
    """A FULL head that is not sealed, written again sealed (None if it is): the keyframe a MERGE write
    stored to start a chain, whose zstd stream the next PATCH frames would have gone on with. A cold read
    then decodes it in one shot, without a stream's window and bookkeeping: a third of the read of a state
    of a few KB."""
    header = _header(frame, session_id, head)
    if header.version != head:  # never sealed as the head's: the read names it, and so does verify
        raise DataLoss(f"session {session_id!r} version {head}: the frame stored there is version {header.version}'s")
    if header.sealed:
        return None
    state = decode([frame])  # checked against its state_size and XXH3-64
    key, value, meta_end = stored(frame, sid, head)
    full = keyframe(state, version=head, policy=policy)
    return Rewrite([(key, value[:meta_end] + full.data)], full.stored_bytes - (len(value) - meta_end), len(state))


def _canonical(state: bytes, message_type: str, resolve: Resolve) -> bytes | None:
    """The canonical serialization of a typed session's head state, if at most COMPACT_FOLD_MAX_FRACTION of
    its bytes; else None (an untyped session, a type not known here, a state that keeps unknown fields)."""
    cls = resolve(message_type) if message_type else None
    if cls is None:
        return None
    try:
        canonical = compact(state, cls)
    except EncodeError:  # it does not parse as its type: kept as it is (verify's to judge)
        return None
    return canonical if len(canonical) <= COMPACT_FOLD_MAX_FRACTION * len(state) else None


def _header(frame: memoryview, session_id: str, version: int) -> FrameHeader:
    try:
        return parse(frame)[0]
    except DecodeError as exc:
        raise DataLoss(f"session {session_id!r} version {version}: {exc}") from None


def _kind(frame: memoryview, session_id: str, version: int) -> FrameKind:
    try:
        return frame_kind(frame)
    except DecodeError as exc:
        raise DataLoss(f"session {session_id!r} version {version}: {exc}") from None
