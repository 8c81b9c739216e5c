"""The store engine: writes and group commit, reads and chains, request ids, retention, indexes, caches."""

from ..storage import RWLock, check_not_truncated
from .cache import LRU
from .dirlock import lock_data_dir
from .encodeahead import ENCODE_AHEAD_BYTES
from .engine import Store
from .headreads import HeadEvents, advance_head, read_head, read_info
from .listings import count_sessions
from .reads import StoredFrame, stored_frames
from .records import request_of_session
from .stateevents import GetWithEvents
from .types import (
    OFF_LOOP_PATCH_BYTES,
    AppendResult,
    EventPage,
    EventQuery,
    GetResult,
    NewEvent,
    PutRequest,
    PutResult,
    ReadBound,
    SessionInfo,
    SweepResult,
    VersionInfo,
    WriteMode,
)
from .writes import PreparedPut

# RWLock and check_not_truncated live in sidecar/storage (the LMDB side of the seam); re-exported for
# the rooms that import them from here (bench.harness.systems, server.workers).
__all__ = [
    "ENCODE_AHEAD_BYTES",
    "LRU",
    "OFF_LOOP_PATCH_BYTES",
    "AppendResult",
    "EventPage",
    "EventQuery",
    "GetResult",
    "GetWithEvents",
    "HeadEvents",
    "NewEvent",
    "PreparedPut",
    "PutRequest",
    "PutResult",
    "RWLock",
    "ReadBound",
    "SessionInfo",
    "Store",
    "StoredFrame",
    "SweepResult",
    "VersionInfo",
    "WriteMode",
    "advance_head",
    "check_not_truncated",
    "count_sessions",
    "lock_data_dir",
    "read_head",
    "read_info",
    "request_of_session",
    "stored_frames",
]
