"""The event log half of :class:`~.engine.Store`: append (with a checkpoint in the same transaction) and read."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from ..errors import InvalidArgument
from ..storage import ReadTxn
from . import keys
from .eventlog import EventLog
from .eventreads import read_events
from .layout import Tables
from .ops import Op
from .stateevents import GetWithEvents, get_with_events
from .types import AppendResult, EventPage, EventQuery, GetResult, NewEvent, PutRequest, ReadBound
from .writeops import WriteOps
from .writer import Writer
from .writes import checked_off_loop


class EventEntryPoints:
    """A mixin: Store sets these attributes."""

    _writer: Writer
    _ops: WriteOps
    _events: EventLog
    _tables: Tables
    _read: Callable[[], AbstractContextManager[ReadTxn]]
    _cached: Callable[[bytes, int], GetResult | None]
    _asubmit_op: Callable[[Op, asyncio.AbstractEventLoop], asyncio.Future[Any]]

    def append_events(
        self,
        session_id: str,
        events: Sequence[NewEvent],
        *,
        put: PutRequest | None = None,
        request_id: str = "",
        expected_last_seq: int | None = None,
    ) -> AppendResult:
        """Append events to a session's log (seqs 1, 2, ... without gaps), and with ``put`` write a checkpoint
        of the session in the same transaction: both commit, or neither (a version conflict on the put
        appends nothing). ``request_id``: a retry appends nothing and answers the first call's result;
        the put's own request_id must be empty. ``expected_last_seq``: append only if the log's last seq is
        this (0: no event yet), else EventSeqConflict and nothing is written. Returns once committed."""
        op = self._append_op(
            session_id, events, put, request_id, expected_last_seq, defer_check=False, encode_ahead=True
        )
        result: AppendResult = self._writer.run_or_submit(op).wait()
        return result

    def aappend_events(
        self,
        session_id: str,
        events: Sequence[NewEvent],
        *,
        put: PutRequest | None = None,
        request_id: str = "",
        expected_last_seq: int | None = None,
    ) -> asyncio.Future[AppendResult]:
        """:meth:`append_events` from asyncio, through the same batches as ``asubmit``'s writes (the future
        resolves once committed; Overloaded raises here when the write queue is full)."""
        loop = asyncio.get_running_loop()
        off_loop = put is not None and checked_off_loop(put)
        op = self._append_op(session_id, events, put, request_id, expected_last_seq, defer_check=off_loop)
        return self._asubmit_op(op, loop)

    def _append_op(
        self,
        session_id: str,
        events: Sequence[NewEvent],
        put: PutRequest | None,
        request_id: str,
        expected_last_seq: int | None = None,
        *,
        defer_check: bool,
        encode_ahead: bool = False,
    ) -> Op:
        if not isinstance(events, Sequence):
            raise InvalidArgument(f"events must be a sequence of NewEvent, not {type(events).__name__}")
        put_op = None
        if put is not None:
            if not isinstance(put, PutRequest):
                raise InvalidArgument(f"put must be a PutRequest, not {type(put).__name__}")
            if put.session_id not in ("", session_id):
                raise InvalidArgument(
                    f"put.session_id {put.session_id!r} is not the session appended to ({session_id!r}): leave it"
                    " empty or the same"
                )
            # The append's request id covers the put: the put keeps no record of its own.
            put = dataclasses.replace(put, session_id=session_id, request_id="")
            put_op = self._ops.put_op(put, defer_patch_check=defer_check, field="put.", encode_ahead=encode_ahead)
        return self._events.append_op(session_id, events, put, put_op, request_id, expected_last_seq)

    def read_events(
        self,
        session_id: str,
        query: EventQuery | None = None,
        *,
        max_page_bytes: int = 0,
        bound: ReadBound | None = None,
        beside_bytes: int | None = None,
    ) -> EventPage:
        """A page of a session's events (oldest first unless ``query.newest_first``) and the next page's
        token; NotFound if the session has neither events nor versions. ``max_page_bytes`` (0: no limit)
        ends a page early rather than pass that many bytes encoded (a page holds one event at least).
        ``bound``: ResourceExhausted, and no page, rather than read past it. ``beside_bytes``: the page
        shares its reply with that many bytes (a Get's state): it holds ``max_page_bytes`` less them, and
        is empty, its token at the first event, if that event does not fit (as :meth:`get_with_events`)."""
        return read_events(
            self._read,
            self._tables,
            session_id,
            query or EventQuery(),
            max_page_bytes=max_page_bytes,
            bound=bound,
            beside_bytes=beside_bytes,
        )

    def get_with_events(
        self,
        session_id: str,
        version: int = 0,
        *,
        events: EventQuery,
        use_cache: bool = True,
        max_state_bytes: int | None = None,
        max_page_bytes: int = 0,
        bound: ReadBound | None = None,
    ) -> GetWithEvents:
        """:meth:`get` and a page of :meth:`read_events` of the same session in one read: one call for a
        reader of a state and its log (an agent resuming; a LangGraph saver's head and pending writes).

        Both are read in one read transaction, unless the state cache answers the state (``use_cache``):
        then the page is read in one begun after the cache checked its state is the head, and may hold
        events committed after that version. The Get's errors come first; InvalidArgument of the events
        read names its field ``events.<field>``. Other arguments: those of get and read_events.
        """
        cached = self._cached(keys.session_key(session_id), version) if use_cache else None
        return get_with_events(
            self._read,
            self._tables,
            session_id,
            version,
            events,
            cached=cached,
            max_state_bytes=max_state_bytes,
            max_page_bytes=max_page_bytes,
            bound=bound,
        )
