"""The store's error hierarchy. Each class maps to one gRPC status code in the
server's single translation table; messages name the session, the field and
the limit."""

from __future__ import annotations


class StoreError(Exception):
    """Root of every error the store raises for a request it cannot serve."""


class InvalidArgument(StoreError):
    """The request is malformed (bad id, bad label, malformed MERGE patch)."""


class NotFound(StoreError):
    """The session or version does not exist (or was removed by retention)."""


class AlreadyExists(StoreError):
    """A session that must be new (a fork's target) exists."""


class FailedPrecondition(StoreError):
    """The request is well formed but the store is not in the state it needs: a put names a message
    type that is not registered, or another than its session's; a re-registration changes a field
    incompatibly. Nothing was written."""


class VersionConflict(StoreError):
    """Compare-and-set failed: the head is not the expected version, or its state not the expected one
    (``expected_state_xxh3``, when that was the check)."""

    def __init__(self, session_id: str, expected: int, current: int, *, expected_state_xxh3: int | None = None) -> None:
        if expected_state_xxh3 is not None:  # compare-and-set on the head's content (``expected``: the head)
            asked = f"expected_state_xxh3 {expected_state_xxh3:#018x}"
            message = (
                f"session {session_id!r}: {asked} but the head, version {current}, holds another state"
                if current
                else f"session {session_id!r}: {asked} but the session has no versions (the head is version 0)"
            )
        elif current:
            message = f"session {session_id!r}: expected_version {expected} but the head is version {current}"
        else:  # version 0: nothing was ever written, or the session was deleted
            message = (
                f"session {session_id!r}: expected_version {expected} but the session has no versions"
                " (the head is version 0)"
            )
        super().__init__(message)
        self.session_id = session_id
        self.expected_version = expected
        self.current_version = current
        self.expected_state_xxh3 = expected_state_xxh3


class EventSeqConflict(StoreError):
    """Compare-and-set on an event log failed: its last seq is not the expected one."""

    def __init__(self, session_id: str, expected: int, last: int) -> None:
        super().__init__(
            f"session {session_id!r}: expected_last_seq {expected} but the event log's last seq is {last};"
            " nothing was appended"
        )
        self.session_id = session_id
        self.expected_last_seq = expected
        self.last_seq = last


class ResourceExhausted(StoreError):
    """A size limit was hit (state too large, store full)."""


class StateTooLarge(ResourceExhausted):
    """A state, or a MERGE's result, is larger than max_state_bytes."""


class StoreFull(ResourceExhausted):
    """Nothing was written: the LMDB map reached max_map_size_bytes, or the disk is full."""


class DataLoss(StoreError):
    """A stored frame failed its checksum or chain check."""


class IncompatibleStore(StoreError):
    """The data directory was written by a newer ckpt, in a layout this one does not read."""


class Unavailable(StoreError):
    """The store is closed or closing."""


class Overloaded(Unavailable):
    """Too many bytes of writes are queued for the writer: retry later (with the same request_id).

    Only callers that must not block get it (asyncio: ``Store.asubmit``, so a
    sidecar's unary Puts); blocking callers wait for room instead.
    """
