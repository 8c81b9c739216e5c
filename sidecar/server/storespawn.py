"""Starting a sidecar's store process: its command, its two links, its spec on stdin.

``ckpt serve`` does this first, before it imports grpc and the server (serve_command.py): the gRPC
process's imports (grpc, the stubs, the service) and the store process's (the store engine, LMDB) do
not depend on each other, and started this way they run on two cores at once rather than one after
the other, a sidecar (re)start serving ~0.2 s sooner on the 2-core VM. Hence this module's imports:
the standard library's light modules and childpython.py (which imports no more), nothing of the
server's. StoreLink.start then takes the process over, or starts one itself (a worker of
``--workers``, an application calling ``serve``).
"""

from __future__ import annotations

import importlib.util
import pickle
import socket
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .childpython import child_environment, python_module_command

if TYPE_CHECKING:
    from ..config import ServeConfig
    from .extension import ServerExtension


@dataclass(frozen=True)
class StoreHostSpec:
    """What the gRPC process sends its store process on stdin, pickled (storehost.main)."""

    config: ServeConfig
    #: Served beside the CheckpointService (extension.py); unpickled by importing its module.
    extension: ServerExtension | None = None


class StoreProcess:
    """A store process just started, and the gRPC process's ends of its two links, until taken over."""

    def __init__(self, process: subprocess.Popen[bytes], link: socket.socket, unheld: socket.socket) -> None:
        self.process = process
        self._links: tuple[socket.socket, socket.socket] | None = (link, unheld)

    def take_links(self) -> tuple[socket.socket, socket.socket]:
        """The link for Puts, streams and the link's own messages (whose reading the store process holds
        while a batch gathers), and the one for every other unary call; theirs to close from now on."""
        if self._links is None:
            raise RuntimeError("the store process's links were taken already")
        links, self._links = self._links, None
        return links

    def discard(self) -> None:
        """If its links were not taken: close them and wait until the process exits (it sees them close,
        closes its store and releases the data directory's lock)."""
        if self._links is not None:
            for link in self._links:
                link.close()
            self._links = None
            self.process.wait()


def start_store_process(
    config: ServeConfig,
    *,
    worker: int | None,
    lock_fd: int | None = None,
    extension: ServerExtension | None = None,
) -> StoreProcess:
    """Start the store process serving ``config``'s store (``worker``, ``lock_fd``, ``extension``:
    as StoreLink.start's); it answers READY or FAILED on ``link`` once it has opened the store."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours_unheld, theirs_unheld = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    command = [*python_module_command("ckpt.sidecar.server.storehost"), str(theirs.fileno())]
    command += ["--unheld-fd", str(theirs_unheld.fileno())]
    if worker is not None:
        command += ["--worker", str(worker)]
    fds = (theirs.fileno(), theirs_unheld.fileno())
    try:
        # A session of its own: a terminal's Ctrl-C reaches the gRPC process only, which
        # stops the store process in order (after gRPC's grace), not at once.
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            pass_fds=fds if lock_fd is None else (*fds, lock_fd),
            start_new_session=True,
            env=child_environment(),
        )
    except BaseException:
        ours.close()
        ours_unheld.close()
        raise
    finally:
        theirs.close()
        theirs_unheld.close()
    started = StoreProcess(process, ours, ours_unheld)
    try:
        assert process.stdin is not None
        with process.stdin:
            process.stdin.write(pickle.dumps(StoreHostSpec(config, extension)))
    except BaseException:
        started.discard()
        raise
    return started


def start_serving_store(config: ServeConfig, extension: ServerExtension | None) -> StoreProcess | None:
    """What ``ckpt serve`` starts before anything else: the store process of one serving process, for
    serve() to take over; None where serve() starts none (``--workers``: each worker starts its own)
    or would refuse to start (the event loop named is not installed: serve() says so)."""
    if config.workers > 1:
        return None
    if config.event_loop != "asyncio" and importlib.util.find_spec(config.event_loop) is None:
        return None
    return start_store_process(config, worker=None, extension=extension)
