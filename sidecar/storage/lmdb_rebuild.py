"""An LMDB environment written again into a new file, every database in key order, so that its pages are full.

LMDB's compacted copy (``mdb_env_copy2`` with ``MDB_CP_COMPACT``, what a backup makes) leaves free pages
out but copies each B-tree page as it is: a leaf that a write among other sessions' keys split half full
stays half full in the copy. Putting the keys of each database in order with ``MDB_APPEND`` instead, LMDB
splits a full leaf at the new key, so every leaf but a database's last is full. Every named database of
the main one is written again with its flags, and any plain key of the main database too. The new
environment is written without syncing each commit; the caller flushes the file once it is whole.
"""

from __future__ import annotations

from pathlib import Path

import lmdb

from .files import PRIVATE_DIR_MODE

# A commit of the new environment every this many bytes of values: LMDB keeps a transaction's dirty pages
# in a list of bounded length (MDB_IDL_UM_MAX, 128Ki pages: 512 MiB of 4 KiB pages).
_COMMIT_BYTES = 64 * 1024 * 1024
_COMMIT_ENTRIES = 100_000


class RebuildMismatch(Exception):
    """The new environment does not hold the entries the old one does (raised with what differs)."""


def rebuild(env: lmdb.Environment, txn: lmdb.Transaction, dest: Path, *, max_dbs: int) -> dict[bytes, int]:
    """Write what ``txn`` (a read transaction of ``env``) sees into a new environment in ``dest``, a directory
    without data.mdb; the entries of each database written (b"" for the main database's plain keys),
    checked against the new environment's own counts."""
    databases: dict[bytes, lmdb._Database] = {}
    plain: list[tuple[bytes, bytes]] = []
    for name, value in txn.cursor():
        key = bytes(name)
        try:
            databases[key] = env.open_db(key, txn=txn, create=False)
        except lmdb.IncompatibleError:  # a plain key of the main database, not a database's record
            plain.append((key, bytes(value)))
    # The source's map size: its entries in full pages take no more pages than they take in it (and a store
    # opening the new file keeps the map size its meta page records, as it would the old one's).
    out = lmdb.open(
        str(dest),
        map_size=env.info()["map_size"],
        subdir=True,
        max_dbs=max_dbs,
        sync=False,
        metasync=False,
        readahead=False,
        mode=PRIVATE_DIR_MODE,
    )
    try:
        written: dict[bytes, int] = {b"": len(plain)}
        with out.begin(write=True) as wtxn:
            for name, value in plain:
                wtxn.put(name, value)
        for name, db in databases.items():
            flags = db.flags()
            target = out.open_db(
                name,
                create=True,
                reverse_key=flags["reverse_key"],
                dupsort=flags["dupsort"],
                integerkey=flags["integerkey"],
                integerdup=flags["integerdup"],
                dupfixed=flags["dupfixed"],
            )
            written[name] = _copy_database(out, target, txn.cursor(db=db), append=not flags["dupsort"])
        out.sync(True)
        found = _counts(out, list(databases))
        if found != written:
            differ = sorted(k for k in written.keys() | found.keys() if written.get(k) != found.get(k))
            raise RebuildMismatch(
                "the rebuilt store holds "
                + ", ".join(f"{found.get(k, 0)} entries of {k.decode(errors='replace') or 'the main table'}"
                            f" where the store holds {written.get(k, 0)}" for k in differ)
            )  # fmt: skip
        return written
    finally:
        out.close()


def _copy_database(out: lmdb.Environment, db: lmdb._Database, source: lmdb.Cursor, *, append: bool) -> int:
    count = pending_bytes = pending = 0
    wtxn = out.begin(write=True, db=db)
    try:
        for key, value in source:
            # Appended: in key order already (a dupsort database's duplicates are put plainly).
            wtxn.put(key, value, db=db, append=append)
            count += 1
            pending += 1
            pending_bytes += len(key) + len(value)
            if pending >= _COMMIT_ENTRIES or pending_bytes >= _COMMIT_BYTES:
                wtxn.commit()
                wtxn = out.begin(write=True, db=db)
                pending = pending_bytes = 0
        wtxn.commit()
    except BaseException:
        wtxn.abort()
        raise
    return count


def _counts(env: lmdb.Environment, names: list[bytes]) -> dict[bytes, int]:
    with env.begin() as txn:
        found = {name: txn.stat(env.open_db(name, txn=txn, create=False))["entries"] for name in names}
        found[b""] = sum(1 for name, _ in txn.cursor() if name not in found)
    return found
