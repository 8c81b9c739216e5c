"""The one place where store errors become gRPC status codes (and back, for clients)."""

from __future__ import annotations

import grpc

from .errors import (
    AlreadyExists,
    DataLoss,
    EventSeqConflict,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    StoreError,
    Unavailable,
    VersionConflict,
)

#: Trailing metadata key carrying the current head on a version conflict.
CURRENT_VERSION_KEY = "ckpt-current-version"
#: Trailing metadata key carrying an event log's last seq on an expected_last_seq conflict.
LAST_SEQ_KEY = "ckpt-last-seq"

STATUS_OF: dict[type[StoreError], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    VersionConflict: grpc.StatusCode.ABORTED,
    EventSeqConflict: grpc.StatusCode.ABORTED,
    ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    DataLoss: grpc.StatusCode.DATA_LOSS,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
}


def status_of(error: StoreError) -> grpc.StatusCode:
    for cls in type(error).__mro__:
        if cls in STATUS_OF:
            return STATUS_OF[cls]
    return grpc.StatusCode.INTERNAL
