"""ckpt's sidecar: the store engine behind its storage seam, the gRPC server, the clients, the `ckpt` CLI, the tools.

The configuration's and the store engine's names here are imported from their modules when first used
(PEP 562): a client (``import ckpt.sidecar.client``) loads neither them nor the codec, while
``from ckpt.sidecar import Store`` works as before.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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
_CONFIG_NAMES = frozenset({"Durability", "Retention", "StoreConfig"})


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(".config" if name in _CONFIG_NAMES else ".store", __name__), name)
    globals()[name] = value  # later lookups find it here, without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
