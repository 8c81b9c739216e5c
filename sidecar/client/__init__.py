"""Python clients of the sidecar: CheckpointClient (sync) and AsyncCheckpointClient."""

from .clients import AsyncCheckpointClient, CheckpointClient, CheckpointError, UnavailableError

__all__ = ["AsyncCheckpointClient", "CheckpointClient", "CheckpointError", "UnavailableError"]
