"""Configuration: the store's and the sidecar's, frozen dataclasses whose fields also declare `ckpt serve`'s options."""

from ..limits import (
    DEFAULT_CACHE_SIZE_BYTES,
    DEFAULT_ENCODER_CACHE_BYTES,
    DEFAULT_MAP_SIZE_BYTES,
    DEFAULT_MAX_COMMIT_DELAY_SECONDS,
    DEFAULT_MAX_MAP_SIZE_BYTES,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MAX_QUEUED_WRITE_BYTES,
    DEFAULT_REPLY_CACHE_BYTES,
    DEFAULT_REQUEST_ID_TTL_SECONDS,
    DEFAULT_SWEEP_INTERVAL_SECONDS,
    MAX_DURATION_SECONDS,
    MAX_MESSAGE_BYTES,
    MAX_STREAM_BATCH_PUTS,
    MESSAGE_ENVELOPE_BYTES,
    check_duration,
)
from .option import Declared, Option, declared, option, size_text
from .serve import EVENT_LOOPS, ServeConfig
from .store import Durability, Retention, StoreConfig

__all__ = [
    "DEFAULT_CACHE_SIZE_BYTES",
    "DEFAULT_ENCODER_CACHE_BYTES",
    "DEFAULT_MAP_SIZE_BYTES",
    "DEFAULT_MAX_COMMIT_DELAY_SECONDS",
    "DEFAULT_MAX_MAP_SIZE_BYTES",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_MAX_QUEUED_WRITE_BYTES",
    "DEFAULT_REPLY_CACHE_BYTES",
    "DEFAULT_REQUEST_ID_TTL_SECONDS",
    "DEFAULT_SWEEP_INTERVAL_SECONDS",
    "EVENT_LOOPS",
    "MAX_DURATION_SECONDS",
    "MAX_MESSAGE_BYTES",
    "MAX_STREAM_BATCH_PUTS",
    "MESSAGE_ENVELOPE_BYTES",
    "Declared",
    "Durability",
    "Option",
    "Retention",
    "ServeConfig",
    "StoreConfig",
    "check_duration",
    "declared",
    "option",
    "size_text",
]
