"""Which events a read asks for: the one declaration of the filters ``events`` and ``get(events=...)`` take."""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import dataclass

from google.protobuf.timestamp_pb2 import Timestamp

from ckpt.v1 import service_pb2

from .arguments import _when, check_int, check_str

#: The sidecar's limit (service.proto): events per page.
MAX_PAGE_SIZE = 1000


@dataclass(frozen=True, slots=True)
class EventFilter:
    """A read of a session's events: those after seq ``after_seq``, of any of ``types`` (empty: all), with
    a time after ``after`` and before ``before`` (aware datetimes, or Timestamps to the nanosecond), if
    given; oldest first (or ``newest_first``), ``page_size`` a page. Pass it to ``get(...,
    events=EventFilter(...))`` to read a state and the first page of these events in one call."""

    after_seq: int = 0
    types: Iterable[str] = ()
    after: datetime.datetime | Timestamp | None = None
    before: datetime.datetime | Timestamp | None = None
    newest_first: bool = False
    page_size: int = 100

    def request(self, session_id: str, page_token: str = "") -> service_pb2.ReadEventsRequest:
        """The ReadEventsRequest of this read of ``session_id`` (TypeError or ValueError naming a bad
        argument), from ``page_token`` (a page's ``next_page_token``) if given."""
        if isinstance(self.types, str):
            raise TypeError("types must be an iterable of str, not a str: pass (name,) for one type")
        if not isinstance(self.newest_first, bool):
            raise TypeError(f"newest_first must be a bool, not {type(self.newest_first).__name__}")
        return service_pb2.ReadEventsRequest(
            session_id=check_str("session_id", session_id),
            after_seq=check_int("after_seq", self.after_seq),
            types=[check_str(f"types[{i}]", t) for i, t in enumerate(self.types)],
            after=_when("after", self.after),
            before=_when("before", self.before),
            newest_first=self.newest_first,
            page_size=check_int("page_size", self.page_size, high=MAX_PAGE_SIZE),
            page_token=check_str("page_token", page_token),
        )
