"""What a saver's ``list`` reads and yields once it knows which checkpoints it wants: their states a page of
a namespace's history at a time, each page's views made oldest first (a state extending the one before
parsed from its new bytes alone), kept only while needed, and their tuples, each list element read once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from langgraph.checkpoint.serde.base import SerializerProtocol

from .backends import HISTORY_PAGE_SIZE, States
from .calls import Call, Op, Out
from .records import WRITES_EVENT, Where, WriteFold, matches, writes_by_checkpoint
from .views import LoadedElements, View, view_tuple, views_of


def listed(
    serde: SerializerProtocol,
    candidates: list[tuple[str, int, str]],
    wheres: dict[str, Where],
    filter: Mapping[str, Any] | None,
    limit: int | None,
) -> Op:
    """Yield (``Out``) the tuples of ``candidates`` (checkpoint id, version, session id) newest first whose
    metadata match ``filter``, at most ``limit``; one gone since it was listed (a prune, a delete) is not."""
    candidates.sort(reverse=True)
    states = ListStates(candidates, limit)
    writes: dict[str, dict[str, WriteFold]] = {}
    loaded: dict[str, LoadedElements] = {}
    unlisted = Counter(sid for _, _, sid in candidates)
    left = limit
    for cid, version, sid in candidates:
        if left is not None and left <= 0:
            return
        unlisted[sid] -= 1
        # Kept to a session's last checkpoint: a listing of every thread interleaves their sessions.
        elements = loaded.setdefault(sid, {}) if unlisted[sid] else loaded.pop(sid, {})
        while not states.ready(sid, version):
            start, size = states.next_page(sid, left)
            states.add(sid, start, (yield Call("history", (sid, start, size))))
        view = states.take(sid, version)
        if view is None:
            continue
        if filter and not matches(serde.loads_typed(view.metadata), filter):
            continue
        if sid not in writes:
            events = yield Call("events", (sid, (WRITES_EVENT,), 0))
            writes[sid] = writes_by_checkpoint(payload for _, _, payload in events)
        fold = writes[sid].get(cid)
        pending = fold.pending(serde) if fold is not None else []
        yield Out(view_tuple(serde, wheres[sid], view, pending, loaded_elements=elements))
        if left is not None:
            left -= 1


class ListStates:
    """The states ``list`` reads, a page of a namespace's history at a time (a call per page, not a Get per
    checkpoint), kept only for the checkpoints it lists and only until it has.

    Each namespace's history is read down from its newest wanted version: versions the labels already
    ruled out above it (newer than ``before``, another ``checkpoint_id``, deleted, restated) are not read,
    and with a limit a page ends at the version of the ``limit``-th wanted one left.
    """

    def __init__(self, candidates: list[tuple[str, int, str]], limit: int | None) -> None:
        self._wanted: dict[str, list[int]] = {}  # per namespace, newest first
        for _, version, sid in candidates:
            self._wanted.setdefault(sid, []).append(version)
        for versions in self._wanted.values():
            versions.sort(reverse=True)
        #: Per namespace, the version its next page starts at (0: none is left); those above it were read.
        self._next = {sid: versions[0] for sid, versions in self._wanted.items()}
        self._read: dict[str, dict[int, View]] = {sid: {} for sid in self._wanted}
        self._kept = {sid: set(versions) for sid, versions in self._wanted.items()}
        self._asked: dict[str, int] = {}  # the last page's size, per namespace

    def ready(self, sid: str, version: int) -> bool:
        """Whether ``version``'s history was read: :meth:`take` answers without another page."""
        return version > self._next[sid]

    def take(self, sid: str, version: int) -> View | None:
        """``version``'s view, forgotten once taken; None if its history was read without it."""
        return self._read[sid].pop(version, None)

    def next_page(self, sid: str, left: int | None) -> tuple[int, int]:
        """Where the next page of ``sid``'s history starts, and how many versions it asks for: down to the
        ``left``-th wanted version (all of them without a limit), twice the last page at least (a filter
        that the labels cannot answer may skip many), at most HISTORY_PAGE_SIZE."""
        start = self._next[sid]
        below = [v for v in self._wanted[sid] if v <= start]
        last = below[min(len(below), left or len(below)) - 1] if below else start
        size = min(HISTORY_PAGE_SIZE, start, max(start - last + 1, 2 * self._asked.get(sid, 0)))
        self._asked[sid] = size
        return start, size

    def add(self, sid: str, start: int, page: States) -> None:
        """A page of ``sid``'s history read from ``start`` down: the wanted states' views kept, the rest
        dropped."""
        wanted = self._kept[sid]
        kept = [(version, state) for version, state in reversed(page) if version <= start and version in wanted]
        self._read[sid].update(zip([v for v, _ in kept], views_of([s for _, s in kept]), strict=True))
        # An empty page: none is left at or below ``start`` (removed since the listing).
        self._next[sid] = page[-1][0] - 1 if page else 0
