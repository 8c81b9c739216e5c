"""The signals that stop a sidecar in order, and a stop asked for before it serves.

SIGTERM, SIGINT and SIGHUP (the terminal a sidecar runs in closed; unless ignored from the start, as
``nohup`` does) each stop it as docs/operations.md says: in-flight calls finish, queued writes commit,
exit 0. Serving (serving.py, and the parent of ``--workers``) handles them once it runs; before that,
``ckpt serve`` and each worker import grpc, the server and the store (~0.4 s), and a signal's default
action would end them at once (exit -15, or -1 for SIGHUP). So their first lines call
:func:`record_early_stops`: a stop signal from then on is recorded, and serving, once its own handlers
are in place, takes it (:func:`take_early_stop`) and stops at once, in order. Hence this module's
imports: the standard library's ``signal`` only.
"""

from __future__ import annotations

import signal
from typing import Any

#: What stops a sidecar in order. SIGHUP only if it was not ignored when this module was imported, the
#: process's first lines: under ``nohup`` it stays ignored, and so in the processes this one starts
#: (workers, store processes), which inherit the ignored disposition.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT) + (
    () if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN else (signal.SIGHUP,)
)

#: The stop signals received since record_early_stops, until taken.
_received: list[int] = []


def record_early_stops() -> None:
    """From now on, until serving handles them itself, record a stop signal instead of dying of it."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _record)
        # As serving's own handlers: a system call the signal interrupts is restarted, not failed.
        signal.siginterrupt(sig, False)


def _record(signum: int, frame: Any) -> None:
    _received.append(signum)


def take_early_stop() -> bool:
    """Whether a stop signal came since :func:`record_early_stops` (forgotten once taken); call it once
    serving's own handlers are in place, so that no signal falls between the two."""
    received = bool(_received)
    _received.clear()
    return received
