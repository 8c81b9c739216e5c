"""Methods a sidecar may serve beside the CheckpointService, in both its processes.

The benchmarks serve an echo this way (``bench/echo_sidecar.py``): bytes
answered by the gRPC process itself, and bytes sent on to the store process
and back, to measure the hop a write makes. An extension is given to
:func:`serve` (or, for a launcher that runs the ``ckpt`` command line itself,
to :func:`extended_serving` around it). It is pickled to the store process
and to each worker of ``--workers``, which unpickle it by importing its
module: define it at the top level of a module they can import.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # not imported at run time: `ckpt serve` reads its extension before it loads grpc
    import grpc

#: A unary gRPC handler of raw bytes (registered without (de)serializers): request in, reply out.
BytesHandler = Callable[[bytes, Any], Awaitable[bytes]]
#: In the store process, what answers one link method: the request's bytes in, the reply's out.
LinkMethod = Callable[[bytes], bytes]


class ServerExtension(Protocol):
    def grpc_handlers(self, forward: Callable[[str], BytesHandler]) -> Sequence[grpc.GenericRpcHandler]:
        """In the gRPC process: handlers the server adds beside the CheckpointService.

        ``forward(name)`` is a handler of raw bytes that sends the request to the
        store process's link method ``name`` (one of :meth:`link_methods`), on
        the link a Put takes, and answers with what that returns.
        """
        ...

    def link_methods(self) -> Mapping[str, LinkMethod]:
        """In the store process: what answers each link method, by name.

        Each runs on the store process's event loop as its call arrives (it
        must not block); what it returns is the reply; an exception ends the
        call INTERNAL.
        """
        ...


_EXTENSION: ContextVar[ServerExtension | None] = ContextVar("ckpt_server_extension", default=None)


@contextlib.contextmanager
def extended_serving(extension: ServerExtension) -> Iterator[None]:
    """Every :func:`serve` in this block (on this thread) that is given no extension serves ``extension``:
    for a launcher that runs the ``ckpt`` command line, which calls ``serve(config)``."""
    token = _EXTENSION.set(extension)
    try:
        yield
    finally:
        _EXTENSION.reset(token)


def current_extension() -> ServerExtension | None:
    """The extension :func:`extended_serving` set here, if any."""
    return _EXTENSION.get()
