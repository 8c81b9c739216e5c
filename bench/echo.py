"""The benchmarks' echo methods, served beside the CheckpointService as a server extension.

- ``/ckpt.bench.Echo/Echo``: raw bytes in, the same bytes out, answered by the
  gRPC process (no (de)serialization on either side): the ceiling of a call;
- ``/ckpt.bench.Echo/LinkEcho``: the same, sent on to the store process over
  the link a Put takes, and answered there unread: what the hop alone costs.

A module of its own, imported by name in every process (``bench.echo_sidecar``
runs as ``__main__``, under which name the store process could not find it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from ..sidecar.server import BytesHandler, LinkMethod

ECHO_SERVICE = "ckpt.bench.Echo"
#: Bytes in, the same bytes out, from the gRPC process: the benchmark's ceiling.
ECHO_METHOD = f"/{ECHO_SERVICE}/Echo"
#: The echo's bytes go to the store process and back: the process hop's cost.
LINK_ECHO_METHOD = f"/{ECHO_SERVICE}/LinkEcho"


def _same_bytes(request: bytes) -> bytes:
    return request


async def _echo(request: bytes, context: Any) -> bytes:
    return request


@dataclass(frozen=True)
class EchoExtension:
    """The two echo methods, as a server extension (pickled to the store process: top level, no state)."""

    def grpc_handlers(self, forward: Callable[[str], BytesHandler]) -> Sequence[grpc.GenericRpcHandler]:
        # No (de)serializers: raw bytes.
        methods = {
            "Echo": grpc.unary_unary_rpc_method_handler(_echo),
            "LinkEcho": grpc.unary_unary_rpc_method_handler(forward("LinkEcho")),
        }
        return [grpc.method_handlers_generic_handler(ECHO_SERVICE, methods)]

    def link_methods(self) -> Mapping[str, LinkMethod]:
        return {"LinkEcho": _same_bytes}
