"""The benchmarks' echo methods, served beside the CheckpointService as a server extension.

- ``/ckpt.bench.Echo/Echo``: raw bytes in, the same bytes out, answered by the
  gRPC process (no (de)serialization on either side): the ceiling of a call;
- ``/ckpt.bench.Echo/LinkEcho``: the same, sent on to the store process over
  the link a Put takes, and answered there unread: what the hop alone costs;
- ``/ckpt.bench.Echo/Sink``: a client stream of raw chunks, read and dropped,
  answered with their total size: a PutBlob's bytes on the wire, nothing else;
- ``/ckpt.bench.Echo/Source``: N bytes streamed back in chunks of a given size
  (GetBlob's): a GetBlob's bytes on the wire, nothing else.

A module of its own, imported by name in every process (``bench.echo_sidecar``
runs as ``__main__``, under which name the store process could not find it).
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from ..sidecar.server import BytesHandler, LinkMethod

ECHO_SERVICE = "ckpt.bench.Echo"
#: Bytes in, the same bytes out, from the gRPC process: the benchmark's ceiling.
ECHO_METHOD = f"/{ECHO_SERVICE}/Echo"
#: The echo's bytes go to the store process and back: the process hop's cost.
LINK_ECHO_METHOD = f"/{ECHO_SERVICE}/LinkEcho"
#: Raw chunks in, dropped; the reply is their total size (8 bytes, little-endian).
SINK_METHOD = f"/{ECHO_SERVICE}/Sink"
#: A :func:`source_request` in, that many bytes out in chunks of the size it names.
SOURCE_METHOD = f"/{ECHO_SERVICE}/Source"
#: The largest chunk Source sends (the sidecar's default message limit).
MAX_SOURCE_CHUNK_BYTES = 64 * 1024 * 1024

_SOURCE_REQUEST = struct.Struct("<QQ")


def _same_bytes(request: bytes) -> bytes:
    return request


async def _echo(request: bytes, context: Any) -> bytes:
    return request


def source_request(size_bytes: int, chunk_bytes: int) -> bytes:
    """What Source is asked: ``size_bytes`` in all, ``chunk_bytes`` a message."""
    return _SOURCE_REQUEST.pack(size_bytes, chunk_bytes)


def sink_total(reply: bytes) -> int:
    """The byte count a Sink answered."""
    return int.from_bytes(reply, "little")


async def _sink(requests: AsyncIterator[bytes], context: Any) -> bytes:
    total = 0
    async for chunk in requests:
        total += len(chunk)
    return total.to_bytes(8, "little")


async def _source(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    if len(request) != _SOURCE_REQUEST.size:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"a Source request is {_SOURCE_REQUEST.size} bytes")
    size, chunk_bytes = _SOURCE_REQUEST.unpack(request)
    if not 1 <= chunk_bytes <= MAX_SOURCE_CHUNK_BYTES:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT, f"chunk_bytes must be in 1..{MAX_SOURCE_CHUNK_BYTES}, got {chunk_bytes}"
        )
    # One buffer sent again and again: the wire's work alone, none of reading a file or building a message.
    # Nothing compresses on these channels, so what the bytes are does not change their cost.
    block = bytes(min(size, chunk_bytes))
    sent = 0
    while sent < size:
        piece = block if size - sent >= len(block) else block[: size - sent]
        yield piece
        sent += len(piece)


@dataclass(frozen=True)
class EchoExtension:
    """The echo methods, as a server extension (pickled to the store process: top level, no state)."""

    def grpc_handlers(self, forward: Callable[[str], BytesHandler]) -> Sequence[grpc.GenericRpcHandler]:
        # No (de)serializers: raw bytes.
        methods = {
            "Echo": grpc.unary_unary_rpc_method_handler(_echo),
            "LinkEcho": grpc.unary_unary_rpc_method_handler(forward("LinkEcho")),
            "Sink": grpc.stream_unary_rpc_method_handler(_sink),
            "Source": grpc.unary_stream_rpc_method_handler(_source),
        }
        return [grpc.method_handlers_generic_handler(ECHO_SERVICE, methods)]

    def link_methods(self) -> Mapping[str, LinkMethod]:
        return {"LinkEcho": _same_bytes}
