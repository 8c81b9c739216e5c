"""LMDB's transactions behind the seam's ReadTxn and WriteTxn: py-lmdb's own bound methods and cursors.

Scans return py-lmdb's cursor iterators, and ``get``, ``put`` and ``delete`` are py-lmdb's methods
themselves: no Python frame per key on a cold read or in a group commit. Opened and ended by
lmdb_storage.py's scopes, which translate their errors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, cast

import lmdb

from .seam import Table


class LmdbReadTxn:
    """A read transaction: py-lmdb's ``get`` itself, and scans that return py-lmdb's cursor iterators.

    Every transaction is opened with buffers=False, so LMDB hands back bytes.
    """

    __slots__ = ("_txn", "get")

    get: Callable[..., Any]

    def __init__(self, txn: lmdb.Transaction) -> None:
        self._txn = txn
        self.get = txn.get

    def scan(self, db: Table, start: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        cur = self._txn.cursor(db=db)
        if not cur.set_range(start):
            return iter(())
        return cast(Iterator[tuple[bytes, bytes]], cur.iternext(keys=True, values=True))

    def scan_keys(self, db: Table, start: bytes = b"") -> Iterator[bytes]:
        cur = self._txn.cursor(db=db)
        if not cur.set_range(start):
            return iter(())
        return cast(Iterator[bytes], cur.iternext(keys=True, values=False))

    def scan_back(self, db: Table, before: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        cur = self._txn.cursor(db=db)
        if not (cur.prev() if before is not None and cur.set_range(before) else cur.last()):
            return iter(())
        return cast(Iterator[tuple[bytes, bytes]], cur.iterprev(keys=True, values=True))

    def last_before(self, db: Table, before: bytes) -> tuple[bytes, bytes] | None:
        cur = self._txn.cursor(db=db)
        if not (cur.prev() if cur.set_range(before) else cur.last()):
            return None
        return cast(tuple[bytes, bytes], cur.item())

    def keys_after(self, db: Table, after: bytes, limit: int) -> list[bytes]:
        out: list[bytes] = []
        for key in self.scan_keys(db, after):
            if key == after:
                continue
            out.append(key)
            if len(out) == limit:
                break
        return out

    def count(self, db: Table) -> int:
        return self._txn.stat(db)["entries"]


class LmdbWriteTxn(LmdbReadTxn):
    """A write transaction: py-lmdb's ``put`` and ``delete`` themselves."""

    __slots__ = ("_env", "delete", "put")

    put: Callable[..., bool]
    delete: Callable[..., bool]

    def __init__(self, env: lmdb.Environment, txn: lmdb.Transaction) -> None:
        super().__init__(txn)
        self._env = env
        self.put = txn.put
        self.delete = txn.delete

    def delete_range(self, db: Table, start: bytes, stop: bytes) -> int:
        cur = self._txn.cursor(db=db)
        removed = 0
        if not cur.set_range(start):
            return 0
        while cast(bytes, cur.key()) < stop:
            cur.delete()  # moves to the next item
            removed += 1
            if not cur.key():  # that was the last one
                break
        return removed

    def nested(self) -> Nested:
        return Nested(self._env, self._txn)


class Committing:
    """A write transaction's scope: committed when its block ends cleanly, aborted when it raises."""

    __slots__ = ("_txn",)
    _txn: lmdb.Transaction

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self._txn.commit()
        else:
            self._txn.abort()


class Nested(Committing):
    """A child transaction of a write transaction (LMDB's nested transactions)."""

    __slots__ = ("_env",)

    def __init__(self, env: lmdb.Environment, parent: lmdb.Transaction) -> None:
        self._env = env
        self._txn = env.begin(write=True, parent=parent)

    def __enter__(self) -> LmdbWriteTxn:
        return LmdbWriteTxn(self._env, self._txn)
