"""One serving process: the store process started, the gRPC server up, until a signal or a failed store.

SIGTERM, SIGINT and SIGHUP (those of the two last not ignored at start:
stopsignals.py) stop it in order (in-flight calls finish, queued writes
commit); one received while it started, as soon as it serves. A store that
stopped taking writes, or a store process that died, stops it with exit 1,
for a supervisor to restart it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Callable, Iterator

from ..config import ServeConfig
from ..errors import StoreError
from .extension import ServerExtension
from .frontend import SidecarServer
from .gctune import serving_gc
from .stopsignals import STOP_SIGNALS, take_early_stop
from .storelink import StoreLink
from .storespawn import StoreProcess

log = logging.getLogger("ckpt")


async def serve_async(
    config: ServeConfig,
    *,
    worker: int | None = None,
    serving: Callable[[], None] | None = None,
    lock_fd: int | None = None,
    extension: ServerExtension | None = None,
    started: StoreProcess | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT/SIGHUP; ``worker``, ``extension``: as SidecarServer's; ``serving`` is called
    once it serves; ``lock_fd``, ``started``: as StoreLink.start's."""
    stop = asyncio.Event()
    with _stopped_by_signals(asyncio.get_running_loop(), stop):
        link = None
        try:
            link = await StoreLink.start(config, worker=worker, lock_fd=lock_fd, extension=extension, started=started)
            sidecar = SidecarServer(config, link, worker=worker, extension=extension)
        except StoreError as exc:
            if link is not None:
                await link.close()
            log.error("ckpt cannot start: %s", exc)
            return 1
        try:
            await sidecar.start()
            if serving is not None:
                serving()
            with serving_gc():
                # A store that stopped taking writes is reopened by restarting: exit
                # (1, so that a supervisor restarts it) rather than serve reads only.
                waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(sidecar.writes_stopped.wait())]
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                for wait in waits:
                    wait.cancel()
        finally:
            await sidecar.stop()
    return 1 if sidecar.failed else 0  # also if the last commit, at close, failed


@contextlib.contextmanager
def _stopped_by_signals(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> Iterator[None]:
    """The stop signals (stopsignals.STOP_SIGNALS) set ``stop`` while this lasts (at once if one came since
    stopsignals.record_early_stops); from its end on, they are ignored.

    Not ``loop.add_signal_handler``: removing such a handler resets the signal
    to its default action (for SIGTERM: terminate) before anything can ignore
    it, so a SIGTERM repeated by a process manager, or a second Ctrl-C, landing
    in that instant killed a sidecar that had just stopped cleanly: exit -15,
    not 0 (2 runs in 25 of a test sending SIGTERM every 0.5 ms). Here each
    signal goes from this handler straight to SIG_IGN. The wake-up fd is what
    asyncio's own handlers use too: a signal delivered to another thread while
    the loop waits in epoll still wakes it, so the Python handler runs at once.
    """
    with contextlib.ExitStack() as cleanup:  # undone in reverse: the signals are ignored first
        wake_r, wake_w = socket.socketpair()
        cleanup.enter_context(wake_r)
        cleanup.enter_context(wake_w)
        wake_r.setblocking(False)
        wake_w.setblocking(False)

        def drain() -> None:  # the byte only wakes the loop; the handler below does the work
            with contextlib.suppress(OSError):
                wake_r.recv(4096)

        def handler(signum: int, frame: object) -> None:
            loop.call_soon_threadsafe(stop.set)

        loop.add_reader(wake_r, drain)
        cleanup.callback(loop.remove_reader, wake_r)
        cleanup.callback(signal.set_wakeup_fd, signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False))
        cleanup.callback(_ignore_stop_signals)
        for sig in STOP_SIGNALS:
            signal.signal(sig, handler)
            # As asyncio's handlers do: a system call the signal interrupts on
            # another thread (the writer's flush, gRPC's) is restarted, not
            # failed with EINTR (signal.signal makes them interruptible).
            signal.siginterrupt(sig, False)
        if take_early_stop():  # asked for while the process started: honoured once it serves
            stop.set()
        yield


def _ignore_stop_signals() -> None:
    # For good, not back to the default: the process is about to exit 0 (or
    # 1), and a late signal must not turn that into -15.
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
