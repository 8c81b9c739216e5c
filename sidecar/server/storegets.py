"""The store process's reads for a Get, run off its event loop: the state (masked if asked), the state with
a page of events, or the reply leaving out a state the caller holds (knownstate.py)."""

from __future__ import annotations

from ckpt.v1 import service_pb2

from ..store import EventPage, EventQuery, GetResult, Store
from .knownstate import known_state, unchanged_reply
from .masking import Masks


class StoreGets:
    """A Get's reads in the store process, on ``store``; event pages end short of ``max_page_bytes``."""

    def __init__(self, store: Store, masks: Masks, *, max_page_bytes: int) -> None:
        self._store, self._masks, self._max_page_bytes = store, masks, max_page_bytes

    def unchanged(self, request: service_pb2.GetRequest, query: EventQuery | None) -> service_pb2.GetResponse | None:
        """The reply without the state if the Get names the state of the version it reads (None: read it);
        InvalidArgument for a known state with a field mask."""
        known = known_state(request)
        if known is None:
            return None
        return unchanged_reply(self._store, request, known, query, max_page_bytes=self._max_page_bytes, bound=None)

    def read(self, request: service_pb2.GetRequest, paths: tuple[str, ...], got: GetResult | None) -> GetResult:
        """The state read (unless the cache gave ``got``), masked to ``paths``."""
        if got is None:
            got = self._store.get(request.session_id, request.version, use_cache=False)
        return self._masks.masked(request.session_id, got, paths) if paths else got

    def read_with_events(
        self, request: service_pb2.GetRequest, paths: tuple[str, ...], query: EventQuery
    ) -> tuple[GetResult, EventPage]:
        """The state and the events read at once (Store.get_with_events), masked to ``paths``."""
        both = self._store.get_with_events(
            request.session_id, request.version, events=query, max_page_bytes=self._max_page_bytes
        )
        got = self._masks.masked(request.session_id, both.got, paths) if paths else both.got
        return got, both.events
