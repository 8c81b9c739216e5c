"""The store engine: writes and group commit, reads and chains, request ids, retention, indexes, caches."""

from .cache import LRU
from .engine import (
    OFF_LOOP_PATCH_BYTES,
    GetResult,
    PutRequest,
    PutResult,
    SessionInfo,
    Store,
    SweepResult,
    VersionInfo,
    WriteMode,
    check_not_truncated,
    lock_data_dir,
    request_of_session,
)
from .rwlock import RWLock

__all__ = [
    "LRU",
    "OFF_LOOP_PATCH_BYTES",
    "GetResult",
    "PutRequest",
    "PutResult",
    "RWLock",
    "SessionInfo",
    "Store",
    "SweepResult",
    "VersionInfo",
    "WriteMode",
    "check_not_truncated",
    "lock_data_dir",
    "request_of_session",
]
