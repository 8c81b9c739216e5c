"""The message types a store knows: the files clients registered (the `types` table) and the built-in ones.

A session may be typed (SessionRecord.message_type): its writes are then
parsed as that type with dynamic messages, MERGE patches validated, and MERGE
states compacted at each chain start. The `types` table holds each
registered file, by name, as its FileDescriptorProto's bytes; built-in files
(sidecar/descriptors.py's BUILT_IN_FILES) are never stored.

Every registration that changes the table adds one to the meta table's
``types_generation``, in its transaction. Other processes writing the same
store (``--workers``) see it: a typed write reads the generation inside its
write transaction (one read; none when this process alone writes the store)
and reloads the table when it moved, and a put naming a type this process
does not know reloads it before refusing. Each generation is one immutable
:class:`Schema`, swapped in whole; cached encoders built with an earlier
generation's classes are rebuilt at their next write (encoders.py).

A registration may not give a field number another type or cardinality,
including one whose field an earlier registration removed: states stored
then still hold it; nor start UTF-8 validating a string that was not
(proto2's, or editions' ``utf8_validation = NONE``): its stored values may
not be UTF-8 (descriptors.py's kind_of marks it). The meta table's ``types_field_history`` (a FieldHistory)
remembers every number each message (and each extendee's extension) has
held; a store written before it was kept starts from its registered files,
which also stand over the record where they disagree (a ckpt that did not
keep it registered them since).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from google.protobuf import descriptor_pool
from google.protobuf.message import DecodeError, Message

from ckpt.store.v1 import records_pb2

from .. import descriptors
from ..descriptors import BUILT_IN_FILES, FieldKey, FieldUse, FileProto
from ..errors import DataLoss, FailedPrecondition, InvalidArgument
from ..storage import ReadTxn, WriteTxn
from .layout import FIELD_HISTORY_KEY, TYPES_GENERATION_KEY, Tables
from .ops import Batch, Op

log = logging.getLogger("ckpt.store")

MessageClass = type[Message]


@dataclass(slots=True)
class Schema:
    """One generation of the registry: its registered files and the pool built from them (and the built-ins)."""

    generation: int
    files: Mapping[str, FileProto]
    pool: descriptor_pool.DescriptorPool
    _classes: dict[str, MessageClass | None] = field(default_factory=dict)

    def message_class(self, name: str) -> MessageClass | None:
        """The dynamic message class of ``name``, None if no file of this generation defines it."""
        try:
            return self._classes[name]
        except KeyError:
            pass
        try:
            cls: MessageClass | None = descriptors.message_class(self.pool.FindMessageTypeByName(name))
        except KeyError:
            cls = None
        self._classes[name] = cls  # racing threads build equal classes: either one is kept
        return cls


def _unregistered(name: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"message_type {name!r} is not registered: call RegisterType with the FileDescriptorSet of its file"
        " (register_type in the Python client, `ckpt register-type`) first"
    )


class Registry:
    """The store's message types, loaded from storage; thread-safe."""

    def __init__(self, tables: Tables, read: Callable[[], AbstractContextManager[ReadTxn]], *, shared: bool) -> None:
        self._tables = tables
        self._read = read
        #: Other processes write this store: a typed write checks the generation in its transaction.
        self.shared = shared
        self._swap = threading.Lock()
        with read() as txn:
            try:
                self.current: Schema = self._load(txn)
            except DataLoss as exc:
                # Untyped sessions are served all the same; a typed write reloads the table and fails
                # naming the damage (`ckpt verify` reports it too).
                log.error("%s; typed sessions cannot be written until it is repaired", exc)
                self.current = Schema(-1, {}, descriptors.build_pool({}))

    # -- resolving types --------------------------------------------------------------

    def resolve(self, name: str) -> MessageClass | None:
        """The class of ``name`` in the current generation (None if unknown): no storage read."""
        return self.current.message_class(name)

    def require(self, name: str) -> MessageClass:
        """The class of ``name``, the registry reloaded from storage first if it is unknown here (another
        process may have registered it); FailedPrecondition if it is not registered at all."""
        cls = self.current.message_class(name)
        if cls is None:
            with self._read() as txn:
                self.sync(txn)
            cls = self.current.message_class(name)
            if cls is None:
                raise _unregistered(name)
        return cls

    def require_in(self, txn: ReadTxn, name: str) -> MessageClass:
        """:meth:`require` inside a write's transaction: the registry that transaction sees (one read of the
        generation when other processes write the store; none otherwise)."""
        if self.shared or self.current.generation < 0:  # < 0: it did not load; this names why
            self.sync(txn)
        cls = self.current.message_class(name)
        if cls is None:
            raise _unregistered(name)
        return cls

    def sync(self, txn: ReadTxn) -> None:
        """Reload the registry from ``txn`` if its stored generation is not the current one."""
        if self._stored_generation(txn) != self.current.generation:
            self._install(self._load(txn))

    # -- registering ------------------------------------------------------------------

    def register_op(self, data: bytes) -> Op:
        """The op registering a serialized FileDescriptorSet; it returns the message types the set defines.

        The set is checked alone here (InvalidArgument); against the stored files in the writer's
        transaction, where nothing is written unless every file builds and every change is compatible.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgument(f"file_descriptor_set must be bytes, not {type(data).__name__}")
        files = descriptors.parse_set(bytes(data))
        sent: dict[str, FileProto] = {}
        for f in files:
            known = BUILT_IN_FILES.get(f.name)
            if known is None:
                sent[f.name] = f
            elif descriptors.definition(f) != descriptors.definition(known):
                raise InvalidArgument(
                    f"file {f.name!r} is built into ckpt and the one sent defines something else: leave it out of"
                    " the set (or send it unchanged)"
                )
        tables = self._tables

        def apply(batch: Batch, txn: WriteTxn) -> list[str]:
            if tables.types is None or tables.meta is None:
                raise InvalidArgument("this store is read-only: it registers no types")
            self.sync(txn)
            old = self.current
            changed = {
                name: f
                for name, f in sent.items()
                if name not in old.files or descriptors.definition(old.files[name]) != descriptors.definition(f)
            }
            if not changed:
                return descriptors.message_types(files, old.pool)
            merged = {**old.files, **changed}
            pool = descriptors.build_pool(merged)
            descriptors.check_compatible(old.pool, pool, [name for name in changed if name in old.files])
            current = descriptors.field_uses(old.pool, old.files)
            known = {**self._field_history(txn), **current}
            new = descriptors.field_uses(pool, changed)
            descriptors.check_field_uses(known, new, current)
            for name, f in changed.items():
                txn.put(name.encode(), f.SerializeToString(deterministic=True), db=tables.types)
            txn.put(FIELD_HISTORY_KEY, _history_record({**known, **new}), db=tables.meta)
            generation = old.generation + 1
            txn.put(TYPES_GENERATION_KEY, b"%d" % generation, db=tables.meta)
            schema = Schema(generation, merged, pool)
            batch.after_commit.append(lambda: self._install(schema))
            return descriptors.message_types(files, pool)

        return Op(apply, fails_clean=True, size_bytes=len(data))

    # -- storage ----------------------------------------------------------------------

    def _stored_generation(self, txn: ReadTxn) -> int:
        meta = self._tables.meta
        raw = txn.get(TYPES_GENERATION_KEY, db=meta) if meta is not None else None
        if raw is None:
            return 0
        try:
            return int(raw)
        except ValueError:
            raise DataLoss(f"the meta table's types_generation {bytes(raw)!r} is not a number") from None

    def _field_history(self, txn: ReadTxn) -> dict[FieldKey, FieldUse]:
        """The field numbers registered messages have held, as the meta table records them ({} if it does not)."""
        meta = self._tables.meta
        raw = txn.get(FIELD_HISTORY_KEY, db=meta) if meta is not None else None
        if raw is None:
            return {}
        try:
            record = records_pb2.FieldHistory.FromString(bytes(raw))
        except DecodeError as exc:
            raise DataLoss(f"the meta table's types_field_history does not parse: {exc}") from None
        return {(u.message, u.number): FieldUse(u.kind, u.name, u.extension) for u in record.fields}

    def _load(self, txn: ReadTxn) -> Schema:
        """The registry as ``txn`` sees it; DataLoss naming a stored file that does not parse or build."""
        generation = self._stored_generation(txn)
        files: dict[str, FileProto] = {}
        if self._tables.types is not None:
            for key, value in txn.scan(self._tables.types):
                name = bytes(key).decode("utf-8", "backslashreplace")
                try:
                    files[name] = FileProto.FromString(bytes(value))
                except DecodeError as exc:
                    raise DataLoss(f"the types table's file {name!r} does not parse: {exc}") from None
        try:
            pool = descriptors.build_pool(files)
        except InvalidArgument as exc:
            raise DataLoss(f"the types table's files do not build: {exc}") from None
        except Exception as exc:  # whatever else building them raises: DataLoss too, so the store still opens
            raise DataLoss(
                f"the types table's files ({len(files)}) do not build: {type(exc).__name__}: {str(exc)[:500]}"
            ) from None
        return Schema(generation, files, pool)

    def _install(self, schema: Schema) -> None:
        # Two threads may load the same change: the newer generation stays.
        with self._swap:
            if schema.generation >= self.current.generation:
                self.current = schema


def _history_record(uses: Mapping[FieldKey, FieldUse]) -> bytes:
    record = records_pb2.FieldHistory()
    for (message, number), use in sorted(uses.items()):
        record.fields.add(message=message, number=number, kind=use.kind, name=use.name, extension=use.extension)
    return record.SerializeToString(deterministic=True)
