"""Keeping a Ctrl-C out of grpcio: the sync client's gRPC work for the main thread, done on a thread of its own.

Python runs signal handlers on the main thread, between two bytecodes of
whatever it runs; grpcio's sync calls take their locks in Python
(``with state.condition:``, a threading.Condition whose ``__enter__`` is a
Python function), so a KeyboardInterrupt raised just after one of those
locks was taken leaves it held for good. The channel's one polling thread
then blocks on it, and every later call of the channel hangs (a resent
put_stream stuck in ``add_done_callback``, a close() waiting out its
timeout). So the main thread hands each step (starting, cancelling a stream)
to a worker thread, waiting on a ``queue.SimpleQueue``, a C lock that a
signal interrupts without leaving it held; a unary call it makes itself,
under a SIGINT handler that holds a signal landing in those locks' code
(call_unary). The other threads, which no signal reaches, call gRPC themselves.

A blob's streams go the same way, a message at a time (ResponseStream,
call_stream_unary): nothing is read ahead, so a blob larger than memory
streams through, and grpcio's threads (never the main one) read a put
blob's file.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal's C functions: its wrappers make enums (6 of 6.5 us)
import os
import queue
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, NamedTuple, TypeVar

import grpc

T = TypeVar("T")


class _Outcome(NamedTuple):
    value: Any
    error: BaseException | None


class _Job(NamedTuple):
    fn: Callable[[], Any]
    reply: queue.SimpleQueue[_Outcome] | None


class _Worker:
    """The thread that runs the main thread's gRPC steps, one at a time, in order.

    One at a time serves: the main thread waits for each step it hands over
    but a cancel. A step the main thread stops waiting for (interrupted) may
    still block (a unary call, until its deadline): its worker is retired,
    ends once done, and the next step goes to a new one.
    """

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="ckpt-grpc-steps", daemon=True).start()

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            try:
                outcome = _Outcome(job.fn(), None)
            except BaseException as exc:  # the caller's to raise
                outcome = _Outcome(None, exc)
            if job.reply is not None:
                job.reply.put(outcome)


_worker: _Worker | None = None


def _current() -> _Worker | None:
    """The main thread's worker: made at its first step, and again in a forked child (the parent's thread
    is not there); None if no thread can be started (Python 3.12+ refuses one at interpreter shutdown: an
    atexit handler's call then runs here). Only the main thread comes here, a signal handler's call too
    (between two of its bytecodes), so no lock: a handler's call landing in this makes at worst a worker of
    its own, where a lock held by the code it interrupted would never be released."""
    global _worker
    worker = _worker
    if worker is None or worker.pid != os.getpid():  # none yet, or it stayed in the parent of a fork
        try:
            worker = _Worker()
        except RuntimeError:  # "can't create new thread at interpreter shutdown"
            return None
        _worker = worker
    return worker


def _retire(worker: _Worker) -> None:
    global _worker
    if _worker is worker:
        _worker = None
    worker.jobs.put(None)  # once its steps are done


def off_main() -> bool:
    """Whether gRPC's code is to be kept off this thread: it is the main thread, where signals land."""
    return threading.current_thread() is threading.main_thread()


def run(fn: Callable[[], T], undo: Callable[[T], object] | None = None) -> T:
    """``fn()``'s result (or its exception), run on the worker if this is the main thread, else here.

    A KeyboardInterrupt (any exception) while waiting for it is raised at
    once; ``fn`` still runs to its end, and ``undo`` is then called on its
    result (to cancel the call it started).
    """
    if not off_main():
        return fn()
    worker = _current()
    if worker is None:
        return fn()
    reply: queue.SimpleQueue[_Outcome] = queue.SimpleQueue()
    worker.jobs.put(_Job(fn, reply))
    try:
        outcome = reply.get()
    except BaseException:
        if undo is not None:
            worker.jobs.put(_Job(lambda: _undo_when_done(reply, undo), None))  # its next step: after ``fn``
        _retire(worker)
        raise
    if outcome.error is not None:
        raise outcome.error
    return outcome.value  # type: ignore[no-any-return]


def _undo_when_done(reply: queue.SimpleQueue[_Outcome], undo: Callable[[Any], object]) -> None:
    try:
        outcome = reply.get_nowait()
    except queue.Empty:  # the caller took it before being interrupted
        return
    if outcome.error is None:
        undo(outcome.value)


def start(fn: Callable[[], object]) -> None:
    """Run ``fn()`` on the worker if this is the main thread (not waited for), else here."""
    worker = _current() if off_main() else None
    if worker is not None:
        worker.jobs.put(_Job(fn, None))
    else:
        fn()


class EndedCall(grpc.RpcError):  # type: ignore[misc]
    """An ended call's status, read on the thread that saw it end: the error the main thread is given, as
    grpcio's own call objects take its locks in every accessor.

    Its code, details and trailers only: grpcio sets the three together when a
    call ends, whether by its status or cancelled (a cancelled call's debug
    string and headers may never come, and a wait for them never ends).
    """

    def __init__(self, call: Any) -> None:
        super().__init__()
        self._code: grpc.StatusCode = call.code()
        self._details: str | None = call.details()
        self._trailing: Any = call.trailing_metadata()

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str | None:
        return self._details

    def trailing_metadata(self) -> Any:
        return self._trailing

    def __str__(self) -> str:
        return f"<EndedCall of RPC that terminated with:\n\tstatus = {self._code}\n\tdetails = {self._details!r}>"


def ended(error: BaseException) -> BaseException:
    """``error``, a gRPC call's, as an EndedCall; any other exception as it is."""
    if isinstance(error, grpc.RpcError) and hasattr(error, "code") and not isinstance(error, EndedCall):
        return EndedCall(error)
    return error


def call_unary(method: Any, request: Any, timeout: float) -> Any:
    """``method(request, timeout=timeout)`` (a sync stub's unary method). Its errors take no lock
    (grpcio's inactive RpcError).

    On the main thread under Python's own SIGINT handler, the call is made here with that handler swapped
    for a guard, which raises the KeyboardInterrupt at once unless the signal lands in the threading
    module's Python code (a Condition's __enter__ or __exit__ that gRPC's Cython runs): there it is held
    and raised once the call has returned. A unary call takes its locks nowhere else in Python (grpcio's
    blocking path runs in Cython, and cleans up after an exception raised while it waits). Handing the
    call to the worker cost each one two thread wake-ups: ~50-70 us of a ~400 us Get on this VM; the
    swap, ~0.5 us. Under a handler of the program's own, the call goes to the worker as other steps do.
    Interrupted there, it is not waited for: it ends in the background, at the latest at its deadline."""
    if not off_main():
        return method(request, timeout=timeout)
    previous = _signal.getsignal(signal.SIGINT)
    if previous in (signal.SIG_IGN, signal.SIG_DFL) or isinstance(previous, _HeldSigint):
        # No KeyboardInterrupt can come; or a signal handler's call, the main thread's own call under way
        # below it, perhaps holding gRPC's channel lock (a reentrant one), which the worker would wait for.
        return method(request, timeout=timeout)
    if previous is not signal.default_int_handler:
        return run(lambda: method(request, timeout=timeout))
    guard = _HeldSigint()
    _signal.signal(signal.SIGINT, guard)
    try:
        response = method(request, timeout=timeout)
    except BaseException:
        if guard.held:
            raise KeyboardInterrupt from None
        raise
    finally:
        _signal.signal(signal.SIGINT, previous)
    if guard.held:
        raise KeyboardInterrupt
    return response


class _HeldSigint:
    """A SIGINT handler raising KeyboardInterrupt, but for a signal landing in the threading module's code,
    which it holds (``held``) for the caller to raise."""

    held = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if frame is not None and frame.f_globals.get("__name__") == "threading":
            self.held = True
            return
        raise KeyboardInterrupt


def call_stream_unary(method: Any, requests: Iterator[Any], cut: Callable[[], object]) -> Any:
    """``method(requests)`` (a sync stub's stream-unary method, without a deadline), started and waited for
    on the worker from the main thread; grpcio reads ``requests`` on a thread of its own. Interrupted,
    ``cut()`` is called first (``requests`` is to give no further message) and the call is cancelled (it
    ends in the background). Its errors are EndedCalls."""
    calls: list[Any] = []

    def begin() -> Any:
        calls.append(method.future(requests))
        return calls[-1]

    try:
        call = run(begin, undo=_cancel)
        return run(lambda: _result(call))
    except grpc.RpcError:
        raise
    except BaseException:
        cut()
        for started in calls:  # else ``begin`` is still under way, and run's undo cancels its call
            start(started.cancel)
        raise


def _result(call: Any) -> Any:
    try:
        return call.result()
    except grpc.RpcError as exc:
        raise ended(exc) from None


def _cancel(call: Any) -> None:
    call.cancel()


class ResponseStream:
    """A response-streaming call (a sync stub's unary-stream method) read from the main thread: started,
    read a message at a time and cancelled on the worker, so a Ctrl-C while waiting for a message leaves
    no grpcio lock held. An exception but the call's own while waiting (a KeyboardInterrupt) cancels it,
    as leaving the ``with`` block does (a no-op once it has ended). Its errors are EndedCalls."""

    def __init__(self, method: Any, request: Any) -> None:
        self._call = run(lambda: method(request), undo=_cancel)
        self._over = False  # its end was read: nothing to cancel

    def __enter__(self) -> ResponseStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()

    def __iter__(self) -> ResponseStream:
        return self

    def __next__(self) -> Any:
        try:
            message = run(self._next)
        except grpc.RpcError:
            self._over = True
            raise
        except BaseException:
            self.cancel()
            raise
        if message is _ENDED:
            self._over = True
            raise StopIteration
        return message

    def _next(self) -> Any:
        try:
            return next(self._call, _ENDED)
        except grpc.RpcError as exc:
            raise ended(exc) from None

    def cancel(self) -> None:
        if not self._over:
            start(self._call.cancel)


_ENDED = object()
