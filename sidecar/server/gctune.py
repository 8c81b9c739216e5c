"""The sidecar's garbage-collector settings: rare young collections, startup objects frozen.

CPython collects its youngest generation whenever tracked allocations exceed
deallocations by 700. A unary write keeps ~40 tracked objects alive until its
group commit answers it (request, op, closures, futures, gRPC's call state),
and 64 clients keep that many writes in flight, so at 700 nearly every young
collection found live objects only: it traversed them, promoted them, and they
died in the next generation. Measured on a real sidecar (64 clients, unary
merges of ~300 B patches, gc.callbacks timing every collection): 226 young
collections in 4,227 merges, 33 us of collector time per merge, against 4.8 us
per call of the echo method. At 10,000 most of what a collection would
have traversed is freed by reference counting before the threshold is reached:
4-6 collections per ~4,000-5,000 merges, ~3 us per merge. What the higher
threshold costs is memory for up to 10,000 young objects (gRPC leaves ~5.4
small cyclic objects per RPC to the collector, ~450 bytes: under 1 MB
between collections, measured with the collector off) and a longer but
rarer pause (~3 ms here). An aborted call leaves its handler's frame in such
a cycle too, so a handler drops the request before it aborts
(forwarding.py), and the store frees a refused write's request when the
write is answered (ops.py, writer.py): kept until a collection, a client
retrying a large write that keeps failing would hold one request a call.

``gc.freeze()`` moves everything allocated at start-up (imports, protobuf
descriptors, the store; ~33,000 objects) out of the collector's sight, so the
rare full collections no longer traverse them.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

#: Net tracked allocations between young collections while the sidecar serves (CPython's default: 700).
SERVING_GEN0_THRESHOLD = 10_000


@contextlib.contextmanager
def serving_gc() -> Iterator[None]:
    """Freeze what exists now and raise the young generation's threshold; restore both on exit."""
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(SERVING_GEN0_THRESHOLD, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
