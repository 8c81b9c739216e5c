"""ReadEvents answered in the gRPC process from LMDB, without its store process, when the read is small.

Forwarded, an empty or one-event read cost ~850 us through the sidecar against ~230 us for
Store.read_events in one process: the hop to the store process and its thread pool. LMDB serves a read
transaction in this process the same committed data (an append is acknowledged after its commit, so the
next read sees it), so a read within INLINE_EVENTS_BOUND runs here, on the event loop. Anything else, and
anything the store refuses or finds wrong (a bad field, an unknown session, damage), is forwarded, so
that the store process answers it with the status it always gave.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import grpc.aio

from ckpt.v1 import service_pb2

from ..store import ReadBound, Store
from .eventconvert import event_query, read_response_pb
from .methods import READ_EVENTS_METHOD
from .storelink import StoreLink

#: The most a read answered here may do on the event loop. Measured in process (a read and its reply's
#: bytes, 2-core shared VM): a block decompressed and parsed costs ~110-150 us whatever its size up to
#: the 48 KiB a block is sealed at, a block skipped by its times ~6 us, each event on the page ~1 us (a
#: page of 256 events of one block: ~380-410 us). So two blocks and 64 events: ~0.3 ms at most, while a
#: session's newest 50 events, in its last one or two blocks, and a saver's few pending writes fit.
INLINE_EVENTS_BOUND = ReadBound(max_blocks=2, max_raw_bytes=2 * 48 * 1024, max_events=64)

Handler = Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]


def inline_read_events(forward: Handler, link: StoreLink, reader: Store, *, max_page_bytes: int) -> Handler:
    """A ReadEvents handler reading ``reader`` (read-only, on the store process's data directory) within
    INLINE_EVENTS_BOUND, else ``forward``ing the request's bytes; ``max_page_bytes``: the store process's."""

    async def read_events(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        start = time.perf_counter()
        try:
            request = service_pb2.ReadEventsRequest.FromString(raw)
            page = reader.read_events(
                request.session_id, event_query(request), max_page_bytes=max_page_bytes, bound=INLINE_EVENTS_BOUND
            )
            body = read_response_pb(page).SerializeToString()
        except Exception:  # past the bound, or anything the store process answers with its status
            return await forward(raw, context)
        link.served(READ_EVENTS_METHOD, time.perf_counter() - start, 0, cached=False)
        return body

    return read_events
