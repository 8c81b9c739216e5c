"""The storage seam (an ordered, transactional key-value store with named tables) and its LMDB implementation."""

from .files import (
    DISK_FULL_ERRNOS,
    PRIVATE_DIR_MODE,
    PRIVATE_FILE_MODE,
    check_holds_a_store,
    holds_nothing,
    in_use_in_this_process,
    make_dirs,
    sync_dir,
)
from .lmdb_open import check_not_truncated
from .lmdb_storage import LmdbStorage, open_lmdb
from .rwlock import RWLock
from .seam import NativeErrors, ReadTxn, Storage, StorageFailure, Table, WriteTxn

__all__ = [
    "DISK_FULL_ERRNOS",
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "LmdbStorage",
    "NativeErrors",
    "RWLock",
    "ReadTxn",
    "Storage",
    "StorageFailure",
    "Table",
    "WriteTxn",
    "check_holds_a_store",
    "check_not_truncated",
    "holds_nothing",
    "in_use_in_this_process",
    "make_dirs",
    "open_lmdb",
    "sync_dir",
]
