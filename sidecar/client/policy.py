"""The clients' one retry policy: which failures are retried, how long to wait, and each call's deadline."""

from __future__ import annotations

import time

import grpc

from .errors import code_of, translate

#: UNAVAILABLE retries of a call by default: waits of 0.05, 0.1, ... 0.8, then 1 s, 4.55 s in all, so that a call
#: outlasts a sidecar restart (~2 s here, 2.7 s on a loaded machine) with room to spare; a sidecar that
#: stays down costs a caller those 4.55 s before the error.
DEFAULT_RETRIES = 8

_LAST_DOUBLING = 5  # 0.05 * 2**5 = 1.6 s: past the 1 s cap

# CANCELLED is what gRPC itself answers a call the sidecar had received but not yet
# started when it began shutting down (the call was never run). These clients never
# cancel a call of their own (an asyncio task's cancellation raises CancelledError
# instead), so a CANCELLED is the sidecar going away: retried, and reported as
# UNAVAILABLE, like every other refusal at shutdown.
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED})

# How long a put_stream still waits for a stream's answers once the stream has ended: gRPC
# hands over what it had received in a few ms (see the two clients' stream loops).
ENDED_STREAM_GRACE_SECONDS = 1.0


def retry_delay_seconds(error: grpc.RpcError, *, retry: bool, attempt: int, retries: int) -> float | None:
    """How long to wait before retrying a failed call, or None to give up (both clients' one policy).

    The callers also give up when the wait would pass the call's deadline, so
    DEADLINE_EXCEEDED, which only the call's own deadline raises, is in
    practice never resent.
    """
    if retry and code_of(error) in RETRYABLE and attempt < retries:
        # The exponent stops where the wait has long reached its cap: ``retries`` may be as large as
        # 2**64 - 1, and 2.0**1024 overflows.
        return min(0.05 * 2.0 ** min(attempt, _LAST_DOUBLING), 1.0)
    return None


class Attempts:
    """One call's retry state: the deadline (``timeout_seconds`` from the start) and the attempts made."""

    def __init__(
        self, timeout_seconds: float, retries: int, retry: bool, request_id: str | None, *, target: str
    ) -> None:
        self.target = target
        self.timeout_seconds = timeout_seconds
        self.deadline = time.monotonic() + timeout_seconds
        self.retries = retries
        self.retry = retry
        self.request_id = request_id
        self.made = 0

    def remaining(self) -> float:
        self.made += 1
        return max(self.deadline - time.monotonic(), 0.001)

    def delay_or_raise(self, error: grpc.RpcError) -> float:
        """Seconds to wait before the next attempt; translates ``error`` if there is none."""
        delay = retry_delay_seconds(error, retry=self.retry, attempt=self.made - 1, retries=self.retries)
        if delay is None or time.monotonic() + delay >= self.deadline:
            translate(
                error,
                attempts=self.made,
                timeout_seconds=self.timeout_seconds,
                request_id=self.request_id,
                target=self.target,
            )
        return delay


class StreamAttempts:
    """put_stream's reconnects: the unary calls' policy and budget (Attempts) for each run of failures.

    A run starts at a stream's failure (that stream was its first attempt) and
    ends at the next answer, so a long stream outlasts any number of restarts
    spread over its life, while a sidecar that keeps refusing (or keeps
    breaking streams before answering) ends it after ``retries`` reconnects,
    or ``timeout_seconds`` after the failure, as a unary call would.
    """

    def __init__(self, timeout_seconds: float, retries: int, *, target: str) -> None:
        self._timeout = timeout_seconds
        self._retries = retries
        self._target = target
        self._run: Attempts | None = None

    def progress(self) -> None:
        self._run = None

    def would_retry(self, error: grpc.RpcError) -> bool:
        attempt = self._run.made - 1 if self._run is not None else 0
        return retry_delay_seconds(error, retry=True, attempt=attempt, retries=self._retries) is not None

    def delay_or_raise(self, error: grpc.RpcError) -> float:
        """Seconds to wait before the next stream; translates ``error`` if there is none."""
        if self._run is None:
            self._run = Attempts(self._timeout, self._retries, True, None, target=self._target)
            self._run.made = 1  # the stream that failed
        delay = self._run.delay_or_raise(error)
        self._run.made += 1  # the stream about to be opened
        return delay


class BlobReadAttempts:
    """A GetBlob's retries (both clients' one rule): the unary reads' statuses and backoff, up to
    ``retries``, but only while no chunk has reached the caller. A read before its first chunk is
    idempotent, so a sidecar restarting (or a connection attempt cut) costs nothing; a failure once a
    chunk was yielded is raised, as the caller holds bytes a new stream would send again. No deadline:
    a blob stream may run far longer than ``timeout_seconds``, so the retries are bounded by count only.
    """

    def __init__(self, retries: int) -> None:
        self._retries = retries
        self.made = 0
        self.delivered = False

    def start(self) -> None:
        """A GetBlob is about to be made."""
        self.made += 1

    def delay_or_raise(self, error: grpc.RpcError) -> float:
        """Seconds to wait before the next GetBlob; translates ``error`` if there is none."""
        if self.delivered:  # the caller holds part of the blob: raised as it is, whatever it is
            translate(error)
        delay = retry_delay_seconds(error, retry=True, attempt=self.made - 1, retries=self._retries)
        if delay is None:
            translate(error, attempts=self.made)
        return delay
