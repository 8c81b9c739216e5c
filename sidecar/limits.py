"""Limits and defaults the configuration, the server and the clients share: a module of its own, so that a
client takes them without importing the configuration (and the codec it names)."""

from __future__ import annotations

import math

#: Largest gRPC message, both directions, on the server and the clients alike.
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: The most max_message_bytes may be: gRPC takes its message size options as C ints.
MAX_MESSAGE_BYTES = 2**31 - 1
#: What a gRPC message may carry besides its state: a PutRequest's session id
#: (256 B), request id (128 B) and labels (64 x ~330 B), or a GetResponse's
#: VersionInfo and labels. ~22 KiB at most; the sidecar keeps this much of
#: every message for them, so any state it accepts can be read back.
MESSAGE_ENVELOPE_BYTES = 64 * 1024
#: The most writes one PutStreamRequest may hold (service.proto). Each write costs the sidecar
#: ~2-4 KB while it is under way, whatever its size, and its result may outweigh it: a 400 KB
#: message of 200,000 empty writes took 770 MB and was answered with 12 MB, so one of the 64 MiB
#: a message may be would have taken ~120 GB.
MAX_STREAM_BATCH_PUTS = 1000
#: The largest blob PutBlob stores (StoreConfig.max_blob_bytes): 4 GiB.
DEFAULT_MAX_BLOB_BYTES = 4 * 1024**3
#: The store's memory budgets, map sizes, write backlog and timings.
DEFAULT_CACHE_SIZE_BYTES = 256 * 1024 * 1024
DEFAULT_ENCODER_CACHE_BYTES = 512 * 1024 * 1024
#: ``ckpt serve`` only: Get replies its gRPC process keeps (replycache.py).
DEFAULT_REPLY_CACHE_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_MAP_SIZE_BYTES = 64 * 1024**3
DEFAULT_MAP_SIZE_BYTES = 256 * 1024 * 1024
DEFAULT_MAX_QUEUED_WRITE_BYTES = 256 * 1024 * 1024
DEFAULT_REQUEST_ID_TTL_SECONDS = 24 * 3600.0
DEFAULT_SWEEP_INTERVAL_SECONDS = 60.0
DEFAULT_MAX_COMMIT_DELAY_SECONDS = 0.010
#: Longest duration a *_seconds setting takes: 100 years. Durations become
#: nanosecond times (now + duration); inf, NaN and anything far longer
#: cannot be one, and made every write or sweep that used them fail.
MAX_DURATION_SECONDS = 100 * 365 * 24 * 3600


def is_port(text: str) -> bool:
    """Whether ``text`` is a TCP port as an address gives it: ASCII digits alone, in 0..65535. int() would
    take "-1", "+5", " 5", "1_0" and other scripts' digits, and gRPC takes a port modulo 65536."""
    return text.isascii() and text.isdigit() and int(text) <= 65535


def check_duration(name: str, seconds: float | None) -> None:
    """TypeError or ValueError naming ``name`` unless ``seconds`` is None or a finite number (int or float, not
    bool) of at most MAX_DURATION_SECONDS."""
    if seconds is None:
        return
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{name} must be a number of seconds (int or float), not {type(seconds).__name__}")
    if not math.isfinite(seconds):
        raise ValueError(f"{name} must be a finite number of seconds, got {seconds}")
    if seconds > MAX_DURATION_SECONDS:
        raise ValueError(f"{name} must be at most {MAX_DURATION_SECONDS} seconds (100 years), got {seconds}")


#: The times the sidecar takes, in nanoseconds since the Unix epoch. A time filter (ListSessions'
#: updated_after and updated_before, ReadEvents' after and before): from protobuf's earliest Timestamp
#: (0001-01-01T00:00:00Z; a filter before the epoch acts as the epoch) to the latest the store keys (a u64).
MIN_FILTER_TIME_NANOS = -62_135_596_800 * 10**9
MAX_FILTER_TIME_NANOS = 2**64 - 1
FILTER_TIME_RANGE = "0001-01-01T00:00:00Z to 2554-07-21T23:34:33.709551615Z"
#: An event's time (Event.time): from the epoch to the latest an int64 of nanoseconds holds.
MIN_EVENT_TIME_NANOS = 0
MAX_EVENT_TIME_NANOS = 2**63 - 1
EVENT_TIME_RANGE = "1970-01-01T00:00:00Z to 2262-04-11T23:47:16.854775807Z"


def map_reserve_bytes(max_map_size_bytes: int) -> int:
    """The part of the LMDB map kept from writes other than deletes, so that a store full of them can still
    delete: 1/64 of max_map_size_bytes, at least 64 KiB (room to delete a session of a small store), at most
    64 MiB and half the cap."""
    return min(max(max_map_size_bytes // 64, 64 * 1024), 64 * 1024 * 1024, max_map_size_bytes // 2)
