"""The store's public types: what a write asks and gets back, what a read and a listing return."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ...codec import FrameKind


class WriteMode(enum.IntEnum):
    REPLACE = 1
    MERGE = 2
    FORK = 3  # version 1 of a forked session


@dataclass(frozen=True, slots=True)
class PutResult:
    version: int
    stored_bytes: int
    frame_kind: FrameKind
    state_size: int
    replayed: bool = False
    #: Frames after the chain's FULL frame, this one included (0 for a FULL frame).
    chain_depth: int = 0


@dataclass(frozen=True, slots=True)
class VersionInfo:
    version: int
    parent_version: int
    created_unix_nanos: int
    frame_kind: FrameKind
    stored_bytes: int
    state_size: int
    labels: dict[str, str]
    mode: WriteMode
    #: The message type the version's state holds (registry.py); "" for opaque bytes.
    message_type: str = ""


@dataclass(frozen=True, slots=True)
class GetResult:
    version: int
    state: bytes
    info: VersionInfo


@dataclass(frozen=True, slots=True)
class SessionInfo:
    session_id: str
    head_version: int
    first_version: int
    created_unix_nanos: int
    updated_unix_nanos: int
    labels: dict[str, str]
    stored_bytes: int
    version_count: int
    forked_from_session_id: str
    forked_from_version: int
    #: The version whose FULL frame starts the head's chain: where a cold read of the head decodes from.
    chain_start_version: int = 0
    #: The session's message type; "" if untyped.
    message_type: str = ""


@dataclass(frozen=True, slots=True)
class PutRequest:
    """One write, as Store.put_many takes them."""

    session_id: str
    state: bytes
    mode: WriteMode = WriteMode.REPLACE
    expected_version: int | None = None
    request_id: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    #: The message type ``state`` holds (a registered or built-in full name); "": the session's, if typed.
    message_type: str = ""


@dataclass(frozen=True, slots=True)
class SweepResult:
    sessions_pruned: int
    versions_removed: int
    request_ids_expired: int
    #: Quiet sessions whose head frame became a FULL frame (keyframe_after_quiet_seconds).
    keyframes_written: int = 0

    @property
    def changed(self) -> bool:
        """Whether the sweep removed or rewrote anything (an idle store's sweeps do not)."""
        return bool(self.versions_removed or self.request_ids_expired or self.keyframes_written)

    def __add__(self, other: SweepResult) -> SweepResult:
        return SweepResult(
            self.sessions_pruned + other.sessions_pruned,
            self.versions_removed + other.versions_removed,
            self.request_ids_expired + other.request_ids_expired,
            self.keyframes_written + other.keyframes_written,
        )


#: A MERGE patch this big or bigger is checked on a thread, not the event loop (Store.asubmit).
#: Below it the check takes at most ~10 ms here; a thread costs ~0.1 ms either way.
OFF_LOOP_PATCH_BYTES = 16 * 1024
