"""The storage seam: the one interface through which the store engine reaches its data.

An ordered, transactional key-value store with named tables. Keys and values
are bytes; keys compare bytewise (memcmp order, a prefix before its
extensions). The engine's logic (chains, compare-and-set, request ids,
retention, indexes) is built on these operations alone; docs/storage.md is
the contract a second implementation (PostgreSQL: bytea keys, which compare
bytewise too) must keep. LMDB implements it in lmdb_storage.py.

Speed is part of the contract. A cold read is one backward scan and a
group commit a few hundred puts, so an implementation may hand out its own
bound methods (``get``, ``put``, ``delete``) and its own iterators instead
of wrapping them; those raise the implementation's own exceptions inside a
transaction, which the engine tells apart by :class:`NativeErrors`. On
leaving a read transaction, and when opening, every error of the
implementation is translated: damage into DataLoss, anything else into
StorageFailure, so that callers outside the engine (tools, the CLI) catch
StoreError alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..errors import DataLoss, StoreError

#: A table handle, from :meth:`Storage.table`: opaque to the engine, passed as ``db=`` to every operation.
Table = Any


class StorageFailure(StoreError):
    """The storage could not serve a request, for a reason that is not damage (e.g. its reader table is full)."""


@dataclass(frozen=True, slots=True)
class NativeErrors:
    """The implementation's own exceptions, as transactions' bound methods raise them, by what they mean."""

    #: The storage has no room left at its current size: nothing of the transaction is kept; ``grow()``
    #: may make room, and the transaction is then redone.
    full: tuple[type[BaseException], ...]
    #: Stored data failed the implementation's own checks (a damaged page, a bad checksum).
    damage: tuple[type[BaseException], ...]


class ReadTxn(Protocol):
    """A read transaction: one consistent snapshot of every table, as of its beginning.

    Nothing committed after it began is visible in it, and everything
    committed before it is. Iterators it hands out are valid until it ends;
    they are lazy (an implementation over a network fetches in pages) and may
    run to the end of the table: callers stop reading once past their range.
    """

    def get(self, key: bytes, *, db: Table) -> bytes | None:
        """The value stored under ``key``, or None."""
        ...

    def scan(self, db: Table, start: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """(key, value) pairs in key order, from the first key >= ``start`` (b"": from the first key)."""
        ...

    def scan_keys(self, db: Table, start: bytes = b"") -> Iterator[bytes]:
        """:meth:`scan`'s keys alone."""
        ...

    def scan_back(self, db: Table, before: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) pairs in descending key order, from the last key < ``before`` (None: from the last key)."""
        ...

    def last_before(self, db: Table, before: bytes) -> tuple[bytes, bytes] | None:
        """The (key, value) pair of the last key < ``before``, or None: :meth:`scan_back`'s first pair, for a
        reader that wants no more (a session's head), without an iterator."""
        ...

    def keys_after(self, db: Table, after: bytes, limit: int) -> list[bytes]:
        """Up to ``limit`` keys > ``after`` (b"": from the first key), in order."""
        ...

    def count(self, db: Table) -> int:
        """How many keys the table holds in this snapshot."""
        ...


class WriteTxn(ReadTxn, Protocol):
    """A write transaction: reads see its own writes; nothing is visible elsewhere until it commits.

    Commits are serialisable: at most one write transaction is open at a
    time on the data (other writers, in this process or another, wait), or
    the implementation detects a conflict and fails the commit. A commit is
    durable when it returns (as far as the durability mode says).
    """

    def put(self, key: bytes, value: bytes, *, db: Table, overwrite: bool = True) -> bool:
        """Store ``value`` under ``key``; with ``overwrite=False``, only if the key is free: whether it stored."""
        ...

    def delete(self, key: bytes, *, db: Table) -> bool:
        """Remove ``key``: whether it was there."""
        ...

    def delete_range(self, db: Table, start: bytes, stop: bytes) -> int:
        """Remove every key in [``start``, ``stop``): how many."""
        ...

    def nested(self) -> AbstractContextManager[WriteTxn]:
        """A nested transaction (a savepoint): its writes join this one's when its block ends, or are
        undone alone if the block raises."""
        ...


class Storage(Protocol):
    """An open store: its tables, its transactions, and what group commit and map growth need."""

    readonly: bool
    #: Where the data is, as error messages name it (LMDB: the path of data.mdb).
    location: str
    errors: NativeErrors
    #: How many times the storage grew (:meth:`grow`, or another process's growth adopted).
    resizes: int

    def table(self, name: str, *, create: bool) -> Table | None:
        """The table ``name``; created if missing and ``create``, else None if missing."""
        ...

    def read(self) -> AbstractContextManager[ReadTxn]:
        """A read transaction. Unavailable once the storage is closed; errors leaving it are translated."""
        ...

    def write(self) -> AbstractContextManager[WriteTxn]:
        """A write transaction, committed when the block ends without an exception, else aborted.

        Errors inside the block and at the commit are the implementation's own
        (see :attr:`errors` and :meth:`why_full`): the writer decides what they mean.
        """
        ...

    def damaged(self, exc: BaseException) -> DataLoss:
        """The DataLoss an error of :attr:`NativeErrors.damage` is reported as."""
        ...

    def grow(self) -> bool:
        """Make room after a full error; False if the storage may not grow (its cap is reached)."""
        ...

    def release_freed(self) -> bool:
        """After a full error the storage cannot grow out of: make room that commits since the last call
        freed but the next transaction may not reuse yet (LMDB: by committing one that changes nothing);
        whether the full transaction is worth redoing."""
        ...

    def open_reserve(self) -> bool:
        """After a full error a delete met: let the storage grow into the room kept back from other writes
        (LMDB: the last part of the map), until :meth:`close_reserve`; False if that is done already."""
        ...

    def close_reserve(self) -> None:
        """Keep the reserve from other writes again (what of it a delete took stays taken)."""
        ...

    def cap_reached(self) -> str:
        """Why the storage cannot grow, for error messages."""
        ...

    def why_full(self, exc: BaseException, needed_bytes: int) -> str | None:
        """Why a failed commit could not write, if for want of space (disk full, a quota, a file size limit);
        None for any other failure. ``needed_bytes``: about what the transaction wrote."""
        ...

    def committed(self) -> None:
        """Called by the writer after each commit, before it answers the writes (LMDB: file upkeep)."""
        ...

    def flush(self) -> None:
        """Make every commit so far durable, whatever the durability setting (before removing a file
        that a commit undone by an OS crash would still name)."""
        ...

    def forget_dead_readers(self) -> None:
        """Release what readers in processes that died left held (LMDB: their reader slots)."""
        ...

    def sizes(self) -> tuple[int, int]:
        """(bytes the storage may use before it must grow, bytes in use)."""
        ...

    def copy_to(self, dest: Path, txn: ReadTxn, *, rebuilt: bool = False) -> None:
        """Write a compacted copy of the snapshot ``txn`` into the empty directory ``dest``; ``rebuilt``:
        every table written again in key order, so that its pages are full (slower: for compaction)."""
        ...

    def close(self) -> None:
        """Close: read transactions begun afterwards are refused (Unavailable)."""
        ...
