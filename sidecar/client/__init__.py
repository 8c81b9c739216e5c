"""Python clients of the sidecar: CheckpointClient (sync) and AsyncCheckpointClient, and their errors."""

from ..tls import ClientTLS
from .arguments import parse_state
from .async_client import AsyncCheckpointClient
from .channel import ENV_VARS
from .errors import (
    AlreadyExistsError,
    CheckpointError,
    ClientClosedError,
    ConflictError,
    DataLossError,
    DeadlineExceededError,
    EventConflictError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    UnavailableError,
)
from .eventfilter import EventFilter
from .events import event
from .policy import DEFAULT_RETRIES
from .sync_client import CheckpointClient

__all__ = [
    "DEFAULT_RETRIES",
    "ENV_VARS",
    "AlreadyExistsError",
    "AsyncCheckpointClient",
    "CheckpointClient",
    "CheckpointError",
    "ClientClosedError",
    "ClientTLS",
    "ConflictError",
    "DataLossError",
    "DeadlineExceededError",
    "EventConflictError",
    "EventFilter",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "NotFoundError",
    "ResourceExhaustedError",
    "UnavailableError",
    "event",
    "parse_state",
]
