"""A version's state and a page of its session's events in one read (Store.get_with_events).

A reader resuming an agent (its state, then the newest events of its log) or a LangGraph saver (the
head, then its pending writes) would otherwise pay two reads, and through the sidecar two round trips.
Read in one transaction, the page is of the very snapshot the state came from.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from ..errors import InvalidArgument
from ..storage import ReadTxn
from . import keys
from .args import MAX_INT, check_int_arg
from .eventreads import check_query, read_events
from .layout import Tables
from .reads import check_version_arg, read_state
from .types import EventPage, EventQuery, GetResult, ReadBound

Read = Callable[[], AbstractContextManager[ReadTxn]]


@dataclass(frozen=True, slots=True)
class GetWithEvents:
    """What Store.get_with_events answers: the state as Store.get reads it, and the page of events."""

    got: GetResult
    events: EventPage


def named_events_field(exc: InvalidArgument) -> InvalidArgument:
    """``exc`` (naming a field of an events read: "page_size must ...") naming it as the nested field it is
    in a Get that also reads events ("events.page_size must ...")."""
    return InvalidArgument(f"events.{exc}")


def get_with_events(
    read: Read,
    tables: Tables,
    session_id: str,
    version: int,
    events: EventQuery,
    *,
    cached: GetResult | None,
    max_state_bytes: int | None,
    max_page_bytes: int,
    bound: ReadBound | None,
) -> GetWithEvents:
    """``version``'s state (``cached`` if the caller's cache answered it) and a page of ``events``: both in
    one read transaction, or, with ``cached``, the events in one begun after the cache was checked.

    The Get's errors come first (NotFound for the session or version); an events read's InvalidArgument
    names its field as ``events.<field>``. ``max_page_bytes`` (0: no limit) bounds the reply: the page
    holds what the state leaves of it, and is empty, with a token resuming at its first event, if not even
    that event fits beside the state.
    """
    check_version_arg(version)
    sid = keys.session_key(session_id)
    check_int_arg("max_page_bytes", max_page_bytes, most=MAX_INT, means="0 = no limit")
    try:
        check_query(events)  # a bad filter is refused before any state is decoded
    except InvalidArgument as exc:
        raise named_events_field(exc) from None
    with read() as txn:
        if cached is None:
            got = read_state(txn, tables, sid, session_id, version, max_state_bytes=max_state_bytes)
        else:
            got = cached
        try:
            page = read_events(
                same_txn(txn),
                tables,
                session_id,
                events,
                max_page_bytes=max_page_bytes,
                bound=bound,
                beside_bytes=len(got.state),
            )
        except InvalidArgument as exc:
            raise named_events_field(exc) from None
    return GetWithEvents(got, page)


def same_txn(txn: ReadTxn) -> Read:
    """A read callable answering ``txn`` itself: read_events then reads the snapshot the state came from.
    (nullcontext, not a generator context manager made per call: it is on every Get with events.)"""
    return lambda: nullcontext(txn)
