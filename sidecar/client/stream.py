"""What both clients' put_stream loops share: one StreamRun per put_stream, around its ledger.

The loops (sync_stream, async_stream) do the I/O: they read ``puts``, send
what the ledger gives them, read the answers and wait. A StreamRun gives the
ledger's decisions their gRPC meaning: whether a stream that ended is reopened
(after how long, by the retry policy) or the put_stream ends, and the error it
ends with, naming how far it got and carrying its unanswered writes.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Literal, NoReturn

import grpc

from ckpt.v1 import service_pb2

from .arguments import new_request_id
from .errors import (
    CheckpointError,
    ClientClosedError,
    DeadlineExceededError,
    ResourceExhaustedError,
    Unknown,
    closed_during,
)
from .ledger import BatchBuilder, BrokenContract, OversizedWrite, StreamLedger, StreamLimits
from .policy import StreamAttempts


class Move(enum.Enum):
    """What a put_stream does after a stream, when it is not to reopen one after a wait."""

    DONE = "done"  # every write answered, and puts ended: return
    WAIT_FOR_WRITE = "wait for a write"  # broken while idle: reopen once there is a write to send


def progress(answered: int, unanswered: Sequence[service_pb2.PutRequest]) -> str:
    if not unanswered:
        return f"put_stream: all {answered} writes sent were answered"
    return (
        f"put_stream: the first {answered} writes were answered; the next {len(unanswered)} (from request_id"
        f" {unanswered[0].request_id!r}) have no result and may have been written: resend .unanswered as they are"
        f" (their request ids make a committed one a replay), then the writes of puts after them"
        f" (from puts[{answered + len(unanswered)}])"
    )


class StreamRun:
    """One put_stream: the builder and ledger of its writes, its reconnects, and how it ends.

    Not thread-safe: the sync loop calls it under its own lock.
    """

    def __init__(
        self,
        *,
        limits: StreamLimits,
        owned: bool,
        timeout_seconds: float,
        retries: int,
        client_name: str,
        target: str,
    ) -> None:
        self.ledger = StreamLedger(limits)
        self.builder = BatchBuilder(limits, owned=owned, new_request_id=new_request_id)
        self.timeout_seconds = timeout_seconds
        self._attempts = StreamAttempts(timeout_seconds, retries, target=target)
        self._target = target
        self._client_name = client_name
        self._failed: BaseException | None = None

    # -- answers

    def answer(self, response: service_pb2.PutStreamResponse | None, now: float) -> list[service_pb2.PutResult]:
        """The results an answer gives (None: the stream ended OK); an answer starts the reconnects' count afresh."""
        try:
            results = self.ledger.eof() if response is None else self.ledger.answered(response, now)
        except BrokenContract as exc:
            raise CheckpointError(str(exc), grpc.StatusCode.INTERNAL) from None
        if results:
            self._attempts.progress()
        return results

    # -- after a stream

    def after_stream(self, error: grpc.RpcError | None, *, closed: bool, timed_out: bool = False) -> float | Move:
        """What to do once a stream has ended (``error``: how, None if OK; ``closed``: the client is;
        ``timed_out``: the answer's bound ended it): the seconds to wait before reopening it, or a Move.
        Raises the error the put_stream ends with."""
        if error is not None and timed_out:
            self.give_up_overdue()
        if closed and error is not None:  # close() ended the stream (idle or not)
            self.give_up_closed()
        if self.ledger.idle and error is not None and self._attempts.would_retry(error):
            return Move.WAIT_FOR_WRITE
        return self._reopen_or_end(error, closed=closed)

    def after_wait(self, error: grpc.RpcError, *, closed: bool) -> float | Literal[Move.DONE]:
        """As after_stream, once Move.WAIT_FOR_WRITE's wait is over."""
        if closed:  # close() ended the wait; a write read meanwhile was not sent
            self.give_up_closed(sent=False)
        return self._reopen_or_end(error, closed=closed)

    def _reopen_or_end(self, error: grpc.RpcError | None, *, closed: bool) -> float | Literal[Move.DONE]:
        if self.ledger.finished:
            if self.failed is not None:
                raise self.failed
            return Move.DONE
        if error is None:
            self.give_up(
                CheckpointError(
                    "the sidecar ended the stream (OK) before every write was sent and answered",
                    grpc.StatusCode.INTERNAL,
                )
            )
        if closed:
            self.give_up_closed()
        try:
            return self._attempts.delay_or_raise(error)
        except CheckpointError as exc:
            self.give_up(exc)

    def check_closed(self, closed: bool) -> None:
        """After the wait before reopening: the client closed meanwhile ends the put_stream."""
        if closed:
            self.give_up_closed()

    # -- how it ends

    @property
    def failed(self) -> BaseException | None:
        """What ended ``puts`` (an exception of its own, or a write refused), once met."""
        end = self.ledger.end
        if self._failed is None and end is not None and end.error is not None:
            self._failed = end.error
            if isinstance(end.error, OversizedWrite):
                self._failed = ResourceExhaustedError(str(end.error), grpc.StatusCode.RESOURCE_EXHAUSTED)
                self._failed.request_id = end.error.request_id
        return self._failed

    def give_up(self, error: Exception) -> NoReturn:
        """End the put_stream with ``error`` (a CheckpointError naming how far it got, with its unanswered
        writes on it), and what ``puts`` raised, if it did, as its cause; but a SystemExit or
        KeyboardInterrupt from ``puts`` goes on as itself (``error`` its cause), so that ``except
        Exception`` does not stop it."""
        if isinstance(error, CheckpointError):
            writes = self.ledger.unanswered()
            error.unanswered = writes
            error.request_id = writes[0].request_id if writes else None
            text = progress(self.ledger.answered_writes, writes)
            error.args = (f"{error.args[0] if error.args else ''}; {text}", *error.args[1:])
        failed = self.failed
        if failed is None:
            raise error from None
        if not isinstance(failed, Exception):
            raise failed from error
        raise error from failed

    def give_up_overdue(self) -> NoReturn:
        self.give_up(
            DeadlineExceededError(
                f"the sidecar at {self._target} did not answer the stream within timeout_seconds="
                f"{self.timeout_seconds} (a put_stream waits that long for each answer while writes are in flight)",
                grpc.StatusCode.DEADLINE_EXCEEDED,
            )
        )

    def closed_error(self, *, sent: bool = True) -> ClientClosedError:
        """The error of a put_stream whose client was closed under it (``sent``: naming the writes unanswered)."""
        writes = self.ledger.unanswered() if sent else []
        text = progress(self.ledger.answered_writes, writes)
        return closed_during(self._client_name, Unknown(text, writes[0].request_id if writes else None, writes))

    def give_up_closed(self, *, sent: bool = True) -> NoReturn:
        self.give_up(self.closed_error(sent=sent))
