"""The event loop a sidecar's processes serve on: uvloop, or the standard library's asyncio loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..errors import Unavailable

#: What ``ServeConfig.event_loop`` may name. uvloop serves the same RPCs with
#: less CPU: side by side on the 2-core VM (`bench.sidecar_ab`, 8 rounds of 64
#: clients), unary merges/s 1.12x asyncio's (higher in every round), server
#: CPU per merge 744 us against 871, per echo call 448 against 518.


def event_loop_factory(event_loop: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes a new event loop of the kind ``event_loop`` names (one of EVENT_LOOPS).

    Unavailable, naming the way out, if that is uvloop and it is not installed.
    """
    if event_loop == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError:
        raise Unavailable(
            "event_loop is uvloop, which is not installed here (pip install uvloop);"
            " --event-loop asyncio runs on the standard library's loop"
        ) from None
    return uvloop.new_event_loop
