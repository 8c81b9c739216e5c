"""The signals that stop a sidecar in order, and a stop asked for before it serves.

SIGTERM, SIGINT and SIGHUP (the terminal a sidecar runs in closed) each stop it as docs/operations.md
says: in-flight calls finish, queued writes commit, exit 0; SIGINT and SIGHUP unless ignored from the
start (below). Serving (serving.py, and the parent of ``--workers``) handles them once it runs; before that,
``ckpt serve`` and each worker import grpc, the server and the store (~0.4 s), and a signal's default
action would end them at once (exit -15, or -1 for SIGHUP). So their first lines call
:func:`record_early_stops`: the `ckpt` command's entry module (ckpt/command.py) and ``python -m
ckpt.sidecar.cli``'s, for ``serve``, before they import the CLI (~0.15 s of imports on a loaded host),
and each worker's (workerstart.py). A stop signal from then on is recorded, and serving, once its own
handlers are in place, takes it (:func:`take_early_stop`) and stops at once, in order. Hence this
module's imports: the standard library's ``signal`` only. What comes before those first lines, the
interpreter's own start (~0.05 s), no Python code can cover: a signal then still ends the process.
"""

from __future__ import annotations

import signal
from typing import Any

#: What stops a sidecar in order. SIGINT and SIGHUP only if not ignored when this module was imported,
#: the process's first lines: whoever started it ignored them so that they do not stop it. A shell
#: without job control starts a background job (``ckpt serve &`` in a script) with SIGINT ignored, so
#: that a Ctrl-C in its terminal does not reach it; ``nohup`` ignores SIGHUP. Each stays ignored, and
#: so in the processes this one starts (workers, store processes), which inherit the disposition.
#: SIGTERM always stops it: it is how process managers (systemd, Docker, Kubernetes) and
#: ``SidecarProcess.stop`` stop a sidecar, no shell or tool ignores it to keep a job running, and a
#: sidecar that kept an inherited ignored SIGTERM could be stopped only by SIGKILL, its calls cut short.
STOP_SIGNALS = (
    signal.SIGTERM,
    *(sig for sig in (signal.SIGINT, signal.SIGHUP) if signal.getsignal(sig) is not signal.SIG_IGN),
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
