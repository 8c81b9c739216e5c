"""ckpt's sidecar: the store engine behind its storage seam, the gRPC server, the clients, the `ckpt` CLI, the tools."""

from .config import Durability, Retention, StoreConfig
from .errors import (
    AlreadyExists,
    DataLoss,
    FailedPrecondition,
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
    "FailedPrecondition",
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
