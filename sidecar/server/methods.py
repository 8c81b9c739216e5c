"""The CheckpointService's methods by name, and the numbers that name them in a link frame."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ckpt.v1 import service_pb2

if TYPE_CHECKING:
    from .extension import ServerExtension

SERVICE = service_pb2.DESCRIPTOR.services_by_name["CheckpointService"]
SERVICE_NAME = SERVICE.full_name
#: The CheckpointService's unary methods, in the order the link numbers them (0, 1, ...).
UNARY_METHODS = tuple(m.name for m in SERVICE.methods if not m.client_streaming and not m.server_streaming)
#: Put's index in UNARY_METHODS: the method a link frame names for a forwarded Put.
PUT_METHOD = UNARY_METHODS.index("Put")
GET_METHOD = UNARY_METHODS.index("Get")
READ_EVENTS_METHOD = UNARY_METHODS.index("ReadEvents")
#: Link methods of the sidecar's own, numbered after UNARY_METHODS: what the gRPC process asks the store
#: process for besides forwarded calls. RECORD_BLOB_METHOD: commit a blob the gRPC process streamed to a
#: file (a ckpt.store.v1.BlobCommit; the reply: a PutBlobResponse). See blobstreams.py.
INTERNAL_METHODS = ("RecordBlob",)
RECORD_BLOB_METHOD = len(UNARY_METHODS) + INTERNAL_METHODS.index("RecordBlob")
#: A server extension's link methods are numbered down from here (the last a frame's u8 holds), so
#: that they never meet the CheckpointService's, numbered up from 0.
LAST_LINK_METHOD = 255
#: How many link methods an extension may add.
MAX_EXTENSION_METHODS = LAST_LINK_METHOD + 1 - len(UNARY_METHODS) - len(INTERNAL_METHODS)


def link_method_numbers(extension: ServerExtension | None) -> dict[str, int]:
    """The number a link frame carries for each of ``extension``'s link methods: from
    LAST_LINK_METHOD down, in the order it names them (both processes number them alike)."""
    if extension is None:
        return {}
    names = list(extension.link_methods())
    if len(names) > MAX_EXTENSION_METHODS:
        raise ValueError(f"an extension may add {MAX_EXTENSION_METHODS} link methods, not {len(names)}")
    return {name: LAST_LINK_METHOD - i for i, name in enumerate(names)}
