"""ckpt's sidecar: the LMDB store (this package's core), the gRPC server, the clients and the `ckpt` CLI."""

from .config import Durability, Retention, StoreConfig
from .errors import (
    AlreadyExists,
    DataLoss,
    IncompatibleStore,
    InvalidArgument,
    NotFound,
    Overloaded,
    ResourceExhausted,
    StateTooLarge,
    StoreError,
    StoreFull,
    Unavailable,
    VersionConflict,
)
from .store import GetResult, PutRequest, PutResult, SessionInfo, Store, SweepResult, VersionInfo, WriteMode

__all__ = [
    "AlreadyExists",
    "DataLoss",
    "Durability",
    "GetResult",
    "IncompatibleStore",
    "InvalidArgument",
    "NotFound",
    "Overloaded",
    "PutRequest",
    "PutResult",
    "ResourceExhausted",
    "Retention",
    "SessionInfo",
    "StateTooLarge",
    "Store",
    "StoreConfig",
    "StoreError",
    "StoreFull",
    "SweepResult",
    "Unavailable",
    "VersionConflict",
    "VersionInfo",
    "WriteMode",
]
