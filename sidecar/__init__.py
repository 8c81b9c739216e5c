"""ckpt's sidecar: the store engine behind its storage seam, the gRPC server, the clients, the `ckpt` CLI, the tools.

The configuration's and the store engine's names here are imported from their modules when first used
(PEP 562): a client (``import ckpt.sidecar.client``) loads neither them nor the codec, while
``from ckpt.sidecar import Store`` works as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ckpt._lazy import lazy_names

from .errors import (
    AlreadyExists,
    DataLoss,
    EventSeqConflict,
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

if TYPE_CHECKING:
    from .config import Durability, Retention, StoreConfig
    from .store import (
        AppendResult,
        EventPage,
        EventQuery,
        GetResult,
        NewEvent,
        PutRequest,
        PutResult,
        SessionInfo,
        Store,
        SweepResult,
        VersionInfo,
        WriteMode,
    )

__all__ = [
    "AlreadyExists",
    "AppendResult",
    "DataLoss",
    "Durability",
    "EventPage",
    "EventQuery",
    "EventSeqConflict",
    "FailedPrecondition",
    "GetResult",
    "IncompatibleStore",
    "InvalidArgument",
    "NewEvent",
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

#: The module each lazily imported name of __all__ comes from (the rest are the errors', above).
_HOMES = {
    **dict.fromkeys(("Durability", "Retention", "StoreConfig"), ".config"),
    **dict.fromkeys(
        (
            "AppendResult",
            "EventPage",
            "EventQuery",
            "GetResult",
            "NewEvent",
            "PutRequest",
            "PutResult",
            "SessionInfo",
            "Store",
            "SweepResult",
            "VersionInfo",
            "WriteMode",
        ),
        ".store",
    ),
}

__getattr__, __dir__ = lazy_names(__name__, _HOMES)
