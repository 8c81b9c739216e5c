"""The gRPC sidecar: the service, status mapping, listening, metrics, the store process and its link."""

from .process import SidecarProcess, start_sidecar_process
from .service import (
    ECHO_METHOD,
    LINK_ECHO_METHOD,
    event_loop_factory,
    serve,
    wait_until_serving,
)

__all__ = [
    "ECHO_METHOD",
    "LINK_ECHO_METHOD",
    "SidecarProcess",
    "event_loop_factory",
    "serve",
    "start_sidecar_process",
    "wait_until_serving",
]
