"""The gRPC sidecar: the service, status mapping, listening, metrics, the store process and its link."""

from .extension import BytesHandler, LinkMethod, ServerExtension, extended_serving
from .launch import serve
from .loops import event_loop_factory
from .process import SidecarProcess, start_sidecar_process, wait_until_serving

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
