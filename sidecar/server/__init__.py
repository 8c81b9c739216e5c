"""The gRPC sidecar: the service, status mapping, listening, metrics, the store process and its link.

The names here are imported from their modules when first used (PEP 562): ``ckpt serve`` starts its
store process (storespawn.py) before it imports grpc and the server, and the store process, started
as ``python -m ckpt.sidecar.server.storehost``, does not import the gRPC server through this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ckpt._lazy import lazy_names

if TYPE_CHECKING:
    from .extension import BytesHandler, LinkMethod, ServerExtension, extended_serving
    from .launch import serve
    from .loops import event_loop_factory
    from .process import SidecarProcess, start_sidecar_process, wait_until_serving

#: Each name of __all__, and the module (in this package) it comes from.
_HOMES = {
    "BytesHandler": ".extension",
    "LinkMethod": ".extension",
    "ServerExtension": ".extension",
    "SidecarProcess": ".process",
    "event_loop_factory": ".loops",
    "extended_serving": ".extension",
    "serve": ".launch",
    "start_sidecar_process": ".process",
    "wait_until_serving": ".process",
}

__all__ = [
    "BytesHandler",
    "LinkMethod",
    "ServerExtension",
    "SidecarProcess",
    "event_loop_factory",
    "extended_serving",
    "serve",
    "start_sidecar_process",
    "wait_until_serving",
]


__getattr__, __dir__ = lazy_names(__name__, _HOMES)
