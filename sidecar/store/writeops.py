"""The write ops: a put, a fork, a delete, as the writer applies them inside its transaction.

A request is checked on the caller's thread (ids, sizes, labels, a MERGE
patch's wire format, a state against the message type it names) before it
is queued; checks against the head (compare-and-set, request-id replays, the
session's own message type) happen inside the writer's transaction, so two
writers can never both succeed against one head.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

from google.protobuf.message import DecodeError, Message

from ckpt.store.v1 import records_pb2

from ...codec import (
    CodecError,
    EncodedFrame,
    EncodeError,
    FrameKind,
    MergeTooLargeError,
    WireFormatError,
    check_patch,
)
from ..config import StoreConfig
from ..descriptors import check_type_name, where_unparsed
from ..errors import (
    AlreadyExists,
    DataLoss,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    StateTooLarge,
    StoreError,
    VersionConflict,
)
from ..storage import ReadTxn, WriteTxn
from . import keys
from .args import byte_size, check_int_arg
from .blobs import Blobs
from .coherence import Coherence
from .encodeahead import Ahead, EncodedAhead
from .encoders import Encoders
from .eventlog import EventLog
from .folds import SEAL_BELOW_BYTES
from .forksource import ForkSource, encode_fork, parses, read_source, still_holds
from .keyframes import QuietSweeps
from .layout import SEGMENTS_LAYOUT, Tables, stamp_layout, write_time
from .ops import Batch, Op
from .reads import check_version_arg, delete_frames
from .records import META_LEN, record, replayed_put, request_made, session_info
from .registry import Registry
from .requestids import RequestIds, write_fingerprint
from .types import PutRequest, PutResult, SessionInfo, VersionInfo, WriteMode


class WriteOps:
    """Builds the ops the writer applies; what they change besides storage goes into their Batch."""

    def __init__(
        self,
        config: StoreConfig,
        tables: Tables,
        encoders: Encoders,
        requests: RequestIds,
        quiet: QuietSweeps,
        coherence: Coherence | None,
        registry: Registry,
        events: EventLog,
        read: Callable[[], AbstractContextManager[ReadTxn]],
    ) -> None:
        self._config = config
        #: A read transaction (a fork reads its source from one before its op is queued).
        self.read = read
        self._events = events
        self._tables = tables
        self._encoders = encoders
        self._requests = requests
        self._quiet = quiet
        self._coherence = coherence
        self._registry = registry
        #: The type a MERGE without one gives an untyped session (StoreConfig.merge_message_type; "": none).
        self._merge_type = config.merge_message_type or ""
        #: What a large put's frame is encoded ahead with, on its caller's thread.
        self.ahead = Ahead(config, tables, encoders.states, registry, read, self._merge_type)
        #: The blobs' references a delete drops and a fork copies (set by the store once it has them).
        self.blobs: Blobs | None = None

    def _session_type(self, sid: bytes) -> str:
        """The message type session ``sid`` holds as storage has it now ("": none, or no such session)."""
        with self.read() as txn:
            raw = txn.get(sid, db=self._tables.sessions)
        return record(raw).message_type if raw is not None else ""

    def put_op(
        self, req: PutRequest, *, defer_patch_check: bool = False, field: str = "", encode_ahead: bool = False
    ) -> Op:
        """The op writing ``req``'s next version; InvalidArgument (or StateTooLarge) if it cannot be queued.

        ``defer_patch_check``: a MERGE patch's check is left to ``op.check``
        (run on a thread before the op is queued, see checkline.py). ``field``: where the put is in
        its request ("put." in an AppendEvents); errors about its fields name them so ("put.labels ...").
        ``encode_ahead``: a large put's frame is encoded here, for the writer only to store it if the
        head has not moved meanwhile (encodeahead.py; never on an event loop: it blocks).
        """
        if not field:
            return self._put_op(req, defer_patch_check, field, encode_ahead)
        try:
            return self._put_op(req, defer_patch_check, field, encode_ahead)
        except (InvalidArgument, FailedPrecondition, StateTooLarge) as exc:
            raise nested_field(field, exc) from None

    def _put_op(self, req: PutRequest, defer_patch_check: bool, field: str, encode_ahead: bool) -> Op:
        sid = keys.session_key(req.session_id)
        try:
            mode = WriteMode(req.mode)
        except ValueError:
            raise InvalidArgument(f"mode must be REPLACE (1) or MERGE (2), got {req.mode!r}") from None
        if mode is WriteMode.FORK:
            raise InvalidArgument("mode must be REPLACE (1) or MERGE (2), got FORK (3)")
        if not isinstance(req.state, (bytes, bytearray, memoryview)):
            raise InvalidArgument(f"state must be bytes, not {type(req.state).__name__}")
        config = self._config
        if (size := byte_size(req.state)) > config.max_state_bytes:
            raise StateTooLarge(f"state is {size} bytes; the limit (max_state_bytes) is {config.max_state_bytes}")
        if not isinstance(req.labels, dict):
            raise InvalidArgument(f"labels must be a dict of str to str, not {type(req.labels).__name__}")
        keys.check_labels(req.labels)
        if not isinstance(req.request_id, str):
            raise InvalidArgument(f"request_id must be a str, not {type(req.request_id).__name__}")
        check_int_arg("expected_version", req.expected_version, optional=True)
        check_int_arg("expected_state_xxh3", req.expected_state_xxh3, optional=True)
        if req.message_type:
            check_type_name(req.message_type)
        rid_key = keys.request_key(sid, req.request_id) if req.request_id else None
        asked = write_fingerprint(req, mode) if rid_key is not None else 0
        state = bytes(req.state)
        encoders, requests, coherence = self._encoders, self._requests, self._coherence
        # The class the state is checked against before queueing (FailedPrecondition if unknown). The
        # closures below read the rest of the typed path off ``req`` and ``self``: each variable they
        # share is an object per write, which the collector traverses while writes wait for their commit.
        checked = self._registry.require(req.message_type) if req.message_type else None

        def check_as_named() -> None:
            try:
                check_state(state, mode, checked)
            except InvalidArgument:
                # Bytes of the session's own type named as another do not parse as that one: the type
                # named is what is wrong, said as the writer says it for bytes that do parse.
                if checked is not None and (have := self._session_type(sid)) and have != req.message_type:
                    raise _other_type(req.session_id, have, req.message_type) from None
                raise

        def check() -> None:
            # On the caller's thread (or one of its loop's): it needs no state,
            # and the writer thread is the store's one serial path.
            try:
                check_as_named()
            except InvalidArgument as exc:
                raise nested_field(field, exc) from None

        if (mode is WriteMode.MERGE or checked is not None) and not defer_patch_check:
            check_as_named()  # named as a nested field by put_op
        # A large put's frame, encoded on this thread (encodeahead.py).
        ahead: EncodedAhead | None = None
        if encode_ahead and not defer_patch_check and self.ahead.worth(sid, len(state), mode):
            ahead = self.ahead.encode(sid, req.session_id, state, mode, req.message_type)
        sessions = self._tables.sessions

        def apply(batch: Batch, txn: WriteTxn) -> PutResult:
            raw = txn.get(sid, db=sessions)
            rec = record(raw) if raw is not None else None
            expired_rid: records_pb2.RequestRecord | None = None
            if rid_key is not None:
                done, live = requests.remembered(txn, rid_key, rec, req, batch)
                if live:
                    assert done is not None
                    # An AppendEvents' record never answers a Put, whatever its fingerprint.
                    if done.events_log_created_unix_nanos or (done.write_xxh3 and done.write_xxh3 != asked):
                        raise InvalidArgument(
                            f"request_id {req.request_id!r} was used for a different write to session"
                            f" {req.session_id!r} (it {request_made(done)}); a retry must resend the same"
                            " write, and a new write needs a new request_id"
                        )
                    return replayed_put(done)
                expired_rid = done
            head = rec.head_version if rec else 0
            if req.expected_version is not None and req.expected_version != head:
                raise VersionConflict(req.session_id, req.expected_version, head)
            expected_xxh3 = req.expected_state_xxh3
            if expected_xxh3 is not None and not encoders.head_has_xxh3(txn, sid, req.session_id, rec, expected_xxh3):
                raise VersionConflict(req.session_id, head, head, expected_state_xxh3=req.expected_state_xxh3)
            if rec is not None and req.labels:
                _check_session_labels(req.session_id, rec, req.labels)
            have = rec.message_type if rec is not None else ""
            named = req.message_type
            if named and have and named != have:
                raise _other_type(req.session_id, have, named)
            typed = named or have
            if not typed and mode is WriteMode.MERGE and self._merge_type:
                # The store's default types a session only if its head parses as that type: bytes of
                # something else (a REPLACE of opaque bytes) stay untyped, this MERGE landing as it would untyped.
                merge_type = self._merge_type
                typed = merge_type if self._head_parses(txn, sid, req.session_id, rec, merge_type) else ""
            elif (
                named
                and not have
                and mode is WriteMode.MERGE
                and not self._head_parses(txn, sid, req.session_id, rec, named)
            ):
                # A typed session's every state parses as its type (compaction, masks and clients rely on it).
                raise FailedPrecondition(
                    f"session {req.session_id!r} is untyped and its head (version {head}) does not parse as"
                    f" {named}, so this put's message_type cannot type it: REPLACE the state with a {named} first,"
                    " or write another session"
                )
            compact: type[Message] | None = None
            if typed:
                compact = self._registry.require_in(txn, typed)
                if compact is not checked:  # typed by the session (or the store's default), or registered again
                    try:
                        check_state(state, mode, compact)
                    except InvalidArgument as exc:
                        raise nested_field(field, exc) from None
            made = ahead
            if made is not None and not made.holds(txn, self._tables, sid, rec, compact):
                made = None  # the head moved since: encoded here, as any other write
            encoder = encoders.for_session(txn, sid, req.session_id, rec, compact) if made is None else made.encoder
            batch.touched_encoders.add(sid)
            if made is not None:  # encoded ahead only within max_state_bytes
                encoders.take(sid, encoder, compact, rec)
                frame = made.frame
            else:
                limit = config.max_state_bytes
                try:
                    # The patch was checked in put_op, before queueing.
                    if mode is WriteMode.REPLACE:
                        frame = encoder.replace(state)
                    else:
                        frame = encoder.merge(state, checked=True, max_state_size=limit)
                except MergeTooLargeError as exc:
                    raise StateTooLarge(
                        f"session {req.session_id!r}: merging {len(state)} bytes onto version {head} would make a"
                        f" state of {exc.state_size} bytes, over max_state_bytes ({limit})"
                    ) from None
                except EncodeError as exc:
                    raise InvalidArgument(f"{field}state cannot be encoded: {exc}") from None
            try:
                now = write_time(txn, self._tables)  # never behind an earlier write's, whatever the clock
                if rec is None:
                    rec = records_pb2.SessionRecord(created_unix_nanos=now, message_type=typed)
                    old_updated = None
                    if coherence is not None:
                        coherence.note_encoder(encoder, now)
                else:
                    old_updated = rec.updated_unix_nanos
                    if typed and not have:  # an untyped session takes the type of its first typed write
                        rec.message_type = typed
                info = self._append(txn, sid, rec, frame, mode, req.labels, now, old_updated, typed)
                result = PutResult(
                    frame.version,
                    frame.stored_bytes,
                    frame.kind,
                    encoder.state_size,
                    chain_depth=encoder.chain.depth,
                    state_xxh3=frame.header.state_xxh3,
                )
                if rid_key is not None:
                    expires = now + int(config.request_id_ttl_seconds * 1e9)
                    requests.remember(txn, rid_key, result, expires, expired_rid, asked, rec.created_unix_nanos, batch)
            except BaseException:
                if made is None:
                    encoder.rollback()
                else:  # kept at its frame, which a batch redone (a full map grown) stores as it is
                    encoders.discard(sid)
                raise
            # Stored in the transaction: from here a failure drops the encoder (the
            # batch's, or the commit's), never rolls it back, so the previous state can go.
            encoder.commit()
            snapshot = encoder.snapshot()  # not a copy: a merge stays O(patch)
            kept = encoders.hold(batch, sid, encoder)  # the closure must not keep `encoder` itself
            batch.after_commit.append(lambda: encoders.after_write(sid, kept, snapshot, info))
            return result

        deferred = check if (mode is WriteMode.MERGE or checked is not None) and defer_patch_check else None
        return Op(apply, fails_clean=True, size_bytes=len(state), check=deferred)

    def _head_parses(
        self, txn: WriteTxn, sid: bytes, session_id: str, rec: records_pb2.SessionRecord | None, type_name: str
    ) -> bool:
        """Whether an untyped session's head state (none: a new session's) parses as ``type_name``."""
        if rec is None:
            return True
        state = self._encoders.for_session(txn, sid, session_id, rec).state
        return parses(self._registry.require_in(txn, type_name), state)

    def fork_op(
        self, session_id: str, version: int, new_session_id: str, labels: dict[str, str], *, copy_events: bool = False
    ) -> Op:
        """The op making ``new_session_id`` whose version 1 is ``version`` (0 = latest) of ``session_id``
        (``copy_events``: with a copy of its event log).

        The source's state is read and encoded here, on the caller's thread (forksource.py): the writer's
        transaction checks that the source still holds it, else reads and encodes it there again.
        """
        sid = keys.session_key(session_id)
        new_sid = keys.session_key(new_session_id, field="new_session_id")
        keys.check_labels(labels)
        check_version_arg(version)
        tables, encoders, coherence, registry = self._tables, self._encoders, self._coherence, self._registry
        policy = self._config.chain_policy
        prepared: ForkSource | None = None
        try:
            with self.read() as rtxn:  # held for the reads only: encoding needs no snapshot
                found = read_source(rtxn, tables, registry, sid, session_id, version)
            prepared = encode_fork(found, policy)
        except (StoreError, CodecError):
            pass  # the writer's transaction reads it again, and fails as it finds it there

        def apply(batch: Batch, txn: WriteTxn) -> SessionInfo:
            if txn.get(new_sid, db=tables.sessions) is not None:
                raise AlreadyExists(f"new_session_id {new_session_id!r} already exists")
            self._events.check_no_log(txn, new_sid, new_session_id)
            if self.blobs is not None and self.blobs.has_refs(txn, new_sid):
                raise AlreadyExists(f"new_session_id {new_session_id!r} already exists (it holds blobs)")
            made = prepared
            if made is None or not still_holds(txn, tables, registry, sid, version, made):
                made = encode_fork(read_source(txn, tables, registry, sid, session_id, version), policy)
            encoder = made.encoder
            encoders.adopt(encoder, made.compact)
            now = write_time(txn, tables)
            rec = records_pb2.SessionRecord(
                created_unix_nanos=now,
                forked_from_session_id=session_id,
                forked_from_version=made.version,
                message_type=made.typed,
            )
            info = self._append(txn, new_sid, rec, made.frame, WriteMode.FORK, labels, now, None, made.typed)
            if self.blobs is not None:  # the fork's state names what its source's does
                self.blobs.copy_refs(txn, sid, new_sid, now)
            if copy_events:
                self._events.copy(txn, sid, new_sid, now)
            encoder.commit()
            if coherence is not None:
                coherence.note_encoder(encoder, now)
            encoders.lru.put(new_sid, encoder)  # a write later in this batch continues this chain
            batch.touched_encoders.add(new_sid)
            snapshot = encoder.snapshot()
            kept = encoders.hold(batch, new_sid, encoder)  # the closure must not keep `encoder` itself
            batch.after_commit.append(lambda: encoders.after_write(new_sid, kept, snapshot, info))
            return session_info(new_session_id, rec)

        return Op(apply, fails_clean=True)

    def delete_op(self, session_id: str) -> Op:
        """The op removing a session, every version, its event log and every index entry: it returns the
        versions and the events removed."""
        sid = keys.session_key(session_id)
        tables, encoders, requests = self._tables, self._encoders, self._requests

        def apply(batch: Batch, txn: WriteTxn) -> tuple[int, int]:
            raw = txn.get(sid, db=tables.sessions)
            had_log, events = self._events.delete(txn, sid)
            if raw is None:
                has_blobs = self.blobs is not None and self.blobs.has_refs(txn, sid)
                if has_blobs:  # blobs stored, no version yet
                    assert self.blobs is not None
                    self.blobs.drop_session(batch, txn, sid)
                if had_log or has_blobs:
                    return 0, events
                raise NotFound(f"session {session_id!r} does not exist")
            try:
                rec: records_pb2.SessionRecord | None = record(raw)
            except DataLoss:
                rec = None  # damaged: deleting it is how an operator starts the session over
            removed, _ = delete_frames(txn, tables.frames, sid, below=None)
            if requests.layout1:
                requests.delete_layout1(txn, sid)
            if rec is not None:
                for key, value in rec.labels.items():
                    txn.delete(keys.label_key(key, value, sid), db=tables.labels)
                txn.delete(keys.updated_key(rec.updated_unix_nanos, sid), db=tables.updated)
            else:  # which index entries are its own is unknown: look through both indexes
                self._delete_index_entries(txn, sid)
            txn.delete(sid, db=tables.sessions)
            if self.blobs is not None:
                self.blobs.drop_session(batch, txn, sid)
            # Dropped now, not only after the commit: a fork onto this id later
            # in the batch starts at version 1 again, and a write after it
            # would take a cached encoder of the deleted session at version 1
            # for the fork's.
            encoders.discard(sid)
            batch.touched_encoders.add(sid)
            batch.after_commit.append(lambda: encoders.forget(sid))
            return removed, events

        return Op(apply, fails_clean=True, frees_room=True)

    def _append(
        self,
        txn: WriteTxn,
        sid: bytes,
        rec: records_pb2.SessionRecord,
        frame: EncodedFrame,
        mode: WriteMode,
        labels: dict[str, str],
        now: int,
        old_updated: int | None,
        message_type: str,
    ) -> VersionInfo:
        """Store the next frame of a session, update its record and indexes; return what was stored."""
        tables = self._tables
        version = rec.head_version + 1
        meta_pb = records_pb2.VersionRecord(created_unix_nanos=now, mode=mode)
        if message_type:  # set only when there is one, as labels: a keyword argument costs even when empty
            meta_pb.message_type = message_type
        if labels:  # most writes carry none; an empty map still costs a Python-level update()
            meta_pb.labels.update(labels)
        meta = meta_pb.SerializeToString()
        value = META_LEN.pack(len(meta)) + meta + frame.data
        if not txn.put(keys.frame_key(sid, version), value, db=tables.frames, overwrite=False):
            raise DataLoss(f"frame of version {version} already exists; the session record is behind its frames")
        if frame.kind is FrameKind.FULL:
            rec.chain_start_version = version
            if mode is WriteMode.MERGE and not frame.header.sealed and frame.header.state_size < SEAL_BELOW_BYTES:
                rec.open_keyframe_version = version  # sealed once quiet (folds.sealed_again)
        elif frame.header.base_version != rec.head_version:  # a segment: an older ckpt could not read it
            stamp_layout(txn, tables, SEGMENTS_LAYOUT)
        rec.head_version = version
        if not rec.first_version:
            rec.first_version = version
        rec.stored_bytes += frame.stored_bytes
        rec.version_count += 1
        for key, value_ in labels.items():
            old = rec.labels.get(key)
            if old != value_:
                if old is not None:
                    txn.delete(keys.label_key(key, old, sid), db=tables.labels)
                txn.put(keys.label_key(key, value_, sid), b"", db=tables.labels)
                rec.labels[key] = value_
        rec.updated_unix_nanos = now
        self._quiet.note_write(txn, now)
        if old_updated is None or not keys.same_updated_granule(old_updated, now):
            if old_updated is not None:
                txn.delete(keys.updated_key(old_updated, sid), db=tables.updated)
            txn.put(keys.updated_key(now, sid), b"", db=tables.updated)
        txn.put(sid, rec.SerializeToString(), db=tables.sessions)
        return VersionInfo(
            version=version,
            parent_version=0 if mode is WriteMode.FORK else version - 1,
            created_unix_nanos=now,
            frame_kind=frame.kind,
            stored_bytes=frame.stored_bytes,
            state_size=frame.header.state_size,
            labels=dict(labels),
            mode=mode,
            message_type=message_type,
            state_xxh3=frame.header.state_xxh3,
        )

    def _delete_index_entries(self, txn: WriteTxn, sid: bytes) -> None:
        """Remove a session's label and updated-time index entries without its record: a scan of both."""
        tables = self._tables
        # Label keys are key SEP value SEP sid (ids hold no SEP); updated keys are a u64 time + sid.
        doomed = [(tables.labels, k) for k in txn.scan_keys(tables.labels) if k.endswith(keys.SEP + sid)]
        doomed += [(tables.updated, k) for k in txn.scan_keys(tables.updated) if k[8:] == sid]
        for db, key in doomed:
            txn.delete(key, db=db)


def _check_session_labels(session_id: str, rec: records_pb2.SessionRecord, labels: dict[str, str]) -> None:
    """A session keeps every label its writes ever gave: bound the union, not just each write's."""
    total = len(rec.labels) + sum(1 for key in labels if key not in rec.labels)
    if total > keys.MAX_LABELS:
        raise InvalidArgument(
            f"session {session_id!r} has {len(rec.labels)} labels; these labels would make it {total},"
            f" over the limit of {keys.MAX_LABELS} per session"
        )


def nested_field(field: str, exc: StoreError) -> StoreError:
    """``exc``, whose message begins with the field it is about ("labels key ..."), naming that field inside
    ``field`` ("put.labels key ..."; ``exc`` itself when ``field`` is "")."""
    return type(exc)(f"{field}{exc}") if field else exc


def _other_type(session_id: str, have: str, named: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"session {session_id!r} holds {have} states; this put's message_type is {named} (a session keeps the"
        " type it was first written with, and its forks keep it: write another session)"
    )


def check_state(state: bytes, mode: WriteMode, message_class: type[Message] | None) -> None:
    """InvalidArgument unless ``state`` is a well-formed MERGE patch (one that parses as ``message_class``,
    if given), or, for a REPLACE of a type, a state that parses as it; the message names the offset."""
    if mode is WriteMode.MERGE:
        try:
            check_patch(state)  # the framing, which the parser does not fully check
        except WireFormatError as exc:
            raise InvalidArgument(f"state is not a valid MERGE patch: {exc}") from None
    if message_class is None:
        return
    try:
        message_class.FromString(state)
    except DecodeError as exc:
        name = message_class.DESCRIPTOR.full_name
        where = ""
        try:
            if mode is not WriteMode.MERGE:
                check_patch(state)  # checked above for a MERGE
            where = where_unparsed(state, message_class)
        except WireFormatError as framing:
            where = str(framing)
        where = where or str(exc).rpartition("': ")[2]
        if mode is WriteMode.MERGE:
            raise InvalidArgument(
                f"state is not a valid MERGE patch: patch of {len(state)} bytes does not parse as {name}: {where}"
            ) from None
        raise InvalidArgument(f"state ({len(state)} bytes) does not parse as {name}: {where}") from None
