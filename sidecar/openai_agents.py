"""An OpenAI Agents SDK session (the ``agents.memory.Session`` protocol) kept in a ckpt session's event log.

The log is append-only, so a conversation is replayed from it rather than stored as rows: each item the
SDK adds is an ``openai_agents.item`` event (its JSON), ``pop_item`` appends an ``openai_agents.pop``
naming the seq of the item it removes, ``clear_session`` an ``openai_agents.clear``. ``get_items`` reads
the log newest first, stopping at the last clear; a pop is appended only onto the log its read saw, in
which the item it names was the newest left (or only undecodable ones were above it), so every event
between that item and the pop is gone too and the read goes on below the item: a ``limit`` or a pop
reads only the tail, however many pops came before. Other events in the same ckpt session (an agent's
own ``tool_call`` log, say) are never read.

Needs the ``openai-agents`` package: ``pip install 'ckpt-sidecar[openai-agents]'``.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncGenerator, Awaitable, Sequence
from contextlib import aclosing
from typing import Any, TypeVar, cast

import grpc

from ckpt.v1 import service_pb2

from .client import AsyncCheckpointClient, EventConflictError, NotFoundError, ResourceExhaustedError, event
from .client.events import MAX_EVENTS_PER_APPEND
from .limits import MESSAGE_ENVELOPE_BYTES

try:
    from agents.items import TResponseInputItem
    from agents.memory.session_settings import SessionSettings, coerce_session_settings, resolve_session_limit
except ImportError as exc:  # the extra is optional: say which one, not only what is missing
    raise ImportError(
        f"ckpt.sidecar.openai_agents needs the OpenAI Agents SDK ({exc}): pip install 'ckpt-sidecar[openai-agents]'"
    ) from exc

__all__ = ["CLEAR", "ITEM", "POP", "CkptSession"]

#: The event types a CkptSession appends and reads; any other type in the log is left alone.
ITEM = "openai_agents.item"
POP = "openai_agents.pop"
CLEAR = "openai_agents.clear"
_TYPES = (ITEM, POP, CLEAR)

#: ReadEvents' largest page (service.proto).
_MAX_PAGE = 1000
#: A pop reads from the tail, where the item it removes usually is: a small page, rarely a second one.
_POP_PAGE = 16
#: What an event adds to an AppendEventsRequest besides its own encoding: its field tag and length.
_EVENT_FRAME_BYTES = 6
#: A payload that is not JSON (``None`` is JSON's null, an item like any other).
_NOT_JSON: Any = object()
#: Past any seq (seqs are u64): no bound yet.
_NO_SEQ = 1 << 64
#: The most seqs one read below a pop spans: the span doubles while the read finds too few items.
_MAX_SPAN = 1 << 16

T = TypeVar("T")


class CkptSession:
    """Conversation history for ``agents.Runner`` (``Runner.run(agent, input, session=...)``) in ckpt's
    event log, with the semantics of the SDK's own ``SQLiteSession``: items come back in the order added,
    ``limit`` gives the latest N in that order (0: none; negative: all), ``pop_item`` removes and returns
    the newest (None when empty), ``clear_session`` empties it. Every change is durable (committed by the
    sidecar) when its call returns, and finishes even if the caller is cancelled meanwhile.

    ``client`` is an ``AsyncCheckpointClient`` the caller owns (and closes); :meth:`connect` makes a
    session with clients of its own, one per event loop that uses it, which :meth:`close` closes.
    ``session_id`` is the ckpt session the events go to (the rules of ``PutRequest.session_id``); an
    agent's checkpoints may share it.
    """

    session_id: str
    session_settings: SessionSettings | None

    def __init__(
        self,
        session_id: str,
        *,
        client: AsyncCheckpointClient,
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(client, AsyncCheckpointClient):
            raise TypeError(
                f"client must be an AsyncCheckpointClient, not {type(client).__name__}"
                " (CkptSession.connect(session_id, target) makes one of its own)"
            )
        self._init(session_id, session_settings)
        self._client: AsyncCheckpointClient | None = client
        self._options: dict[str, Any] | None = None

    @classmethod
    def connect(
        cls,
        session_id: str,
        target: str | None = None,
        *,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        **client_options: Any,
    ) -> CkptSession:
        """A session with ``AsyncCheckpointClient``\\ s of its own to ``target`` (``unix:PATH`` or
        ``host:port``; None: ``CKPT_TARGET`` and the other variables ``from_env`` reads), made with
        ``client_options``: one in each event loop that calls it, at its first call there (so
        ``Runner.run_sync``, successive ``asyncio.run``\\ s and threads with loops of their own may share
        the session), closed by :meth:`close`."""
        if target is not None and not isinstance(target, str):
            raise TypeError(f"target must be a str or None, not {type(target).__name__}")
        session = cls.__new__(cls)
        session._init(session_id, session_settings)
        session._client = None
        session._options = {**client_options, **({"target": target} if target is not None else {})}
        return session

    def _init(self, session_id: str, session_settings: SessionSettings | dict[str, Any] | None) -> None:
        if not isinstance(session_id, str):
            raise TypeError(f"session_id must be a str, not {type(session_id).__name__}")
        self.session_id = session_id
        # As SQLiteSession: no settings means the SDK's defaults (no limit); a dict is checked by the SDK.
        self.session_settings = (
            coerce_session_settings(session_settings) if session_settings is not None else SessionSettings()
        )
        # Each event loop that uses the session: its client (connect()'s own, or the one passed in) and
        # the lock that keeps that loop's changes in the order called. An asyncio.Lock or a grpc.aio
        # channel serves one loop only; the threading lock guards the table, which threads share.
        self._loops: dict[asyncio.AbstractEventLoop, tuple[AsyncCheckpointClient, asyncio.Lock]] = {}
        self._loops_guard = threading.Lock()
        self._closed = False

    async def close(self) -> None:
        """Close the clients :meth:`connect` made (a client passed in stays open): this loop's, and
        those of other loops still open, closed in their own loop when it next runs; calls after it raise
        RuntimeError. Idempotent."""
        self._closed = True
        with self._loops_guard:
            loops, self._loops = self._loops, {}
        if self._options is None:
            return
        current = asyncio.get_running_loop()
        for loop, (client, _) in loops.items():
            if loop is current:
                await client.close()
            elif not loop.is_closed():
                closing = client.close()
                try:
                    asyncio.run_coroutine_threadsafe(closing, loop)
                except RuntimeError:  # that loop closed meanwhile: its channel went with it
                    closing.close()

    async def __aenter__(self) -> CkptSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the Session protocol ---------------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The history, oldest first: all of it, or the latest ``limit`` items (None: the session
        settings' limit). Items whose payload is not JSON are skipped and not counted, as SQLiteSession
        skips rows it cannot decode."""
        client, _ = self._open()
        wanted = resolve_session_limit(limit, self.session_settings)
        if wanted == 0:
            return []
        if wanted is not None and wanted < 0:
            wanted = None  # SQLite's LIMIT -1, which SQLiteSession passes on: no limit
        page = _MAX_PAGE if wanted is None else min(wanted, _MAX_PAGE)
        items: list[TResponseInputItem] = []
        async with aclosing(self._live(client, page)) as live:
            async for _, payload in live:
                item = _decode(payload)
                if item is not _NOT_JSON:
                    items.append(item)
                    if len(items) == wanted:
                        break
        items.reverse()
        return items

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` (JSON-serializable) in one append when they fit in one (1000 events, and the
        client's ``max_message_bytes`` less 64 KiB): all or none are stored. More go in appends that each
        fit, in order, each all or none. An item too big for any append is refused before anything is
        sent (ResourceExhaustedError)."""
        client, lock = self._open()
        if not items:
            return
        events = [event(ITEM, _encode(item)) for item in items]  # TypeError before anything is sent
        batches = _batches(events, client._max_message_bytes - MESSAGE_ENVELOPE_BYTES)
        await _finish(self._append(client, lock, batches))

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the newest item and return it; None if there is none (or the item was JSON's null)."""
        client, lock = self._open()
        return await _finish(self._pop(client, lock))

    async def clear_session(self) -> None:
        """Remove every item (a clear marker: the items stay in the log, unread, until retention or a
        delete of the ckpt session removes them)."""
        client, lock = self._open()
        await _finish(self._append(client, lock, [[event(CLEAR)]]))

    # -- the log -------------------------------------------------------------------------------------

    def _open(self) -> tuple[AsyncCheckpointClient, asyncio.Lock]:
        """The running loop's client and lock, made at its first call."""
        if self._closed:
            raise RuntimeError("CkptSession is closed")
        loop = asyncio.get_running_loop()
        with self._loops_guard:  # threads: each loop gets one client, however many calls start at once
            mine = self._loops.get(loop)
            if mine is None:
                for gone in [other for other in self._loops if other.is_closed()]:
                    del self._loops[gone]  # a closed loop's channel went with it: nothing left to close
                mine = self._loops[loop] = (self._client or self._new_client(), asyncio.Lock())
            return mine

    def _new_client(self) -> AsyncCheckpointClient:
        assert self._options is not None  # only connect() leaves the clients to be made
        options = dict(self._options)
        target = options.pop("target", None)
        if target is not None:
            return AsyncCheckpointClient(target, **options)
        return AsyncCheckpointClient.from_env(**options)

    def _log(
        self, client: AsyncCheckpointClient, types: tuple[str, ...] = _TYPES, **filters: Any
    ) -> AsyncGenerator[service_pb2.Event, None]:
        # An async generator, which the readers close when they stop early rather than leave to the GC.
        return cast(AsyncGenerator[service_pb2.Event, None], client.events(self.session_id, types=types, **filters))

    async def _live(self, client: AsyncCheckpointClient, page_size: int) -> AsyncGenerator[tuple[int, bytes], None]:
        """(seq, payload) of the items still in the session, newest first."""
        # Every event at or above `below` is gone: a pop naming seq s moves it down to s. The log is read
        # newest first from its tail; when a pop sends the read further down than a page, it goes on
        # there, in spans of seqs read oldest first and taken newest first (ReadEvents reads newest first
        # only from the tail), so a pop after many reads as little as one after none.
        below = _NO_SEQ
        try:
            async with aclosing(self._log(client, newest_first=True, page_size=page_size)) as log:
                async for e in log:
                    if e.seq >= below:
                        continue
                    if e.type == CLEAR:
                        return
                    if e.type == POP:
                        below = _below(e, below)
                        if e.seq - below > page_size:
                            break
                    else:
                        yield e.seq, e.payload
                else:
                    return
            span, floor = page_size, 1  # no event of these types lies below floor
            while below > floor:
                low = max(below - span, floor)
                found: list[service_pb2.Event] = []
                async with aclosing(self._log(client, after_seq=low - 1, page_size=min(span, _MAX_PAGE))) as log:
                    async for e in log:
                        if e.seq >= below:
                            break
                        found.append(e)
                if not found and floor == 1:
                    floor = max(await self._oldest_seq(client), 1)  # retention may have dropped the rest
                for e in reversed(found):
                    if e.seq >= below:
                        continue
                    if e.type == CLEAR:
                        return
                    if e.type == POP:
                        below = _below(e, below)
                    else:
                        yield e.seq, e.payload
                below, span = min(below, low), min(span * 2, _MAX_SPAN)
        except NotFoundError:
            return  # no ckpt session of that id yet: an empty conversation

    async def _append(
        self, client: AsyncCheckpointClient, lock: asyncio.Lock, batches: Sequence[Sequence[service_pb2.Event]]
    ) -> None:
        async with lock:  # this loop's changes in the order they were called, a pop's read with its write
            for batch in batches:
                await client.append_events(self.session_id, batch)

    async def _pop(self, client: AsyncCheckpointClient, lock: asyncio.Lock) -> TResponseInputItem | None:
        async with lock:
            while True:
                last = await self._last_seq(client)
                removed = 0  # the decodable item returned, or the oldest undecodable one on the way to it
                item = _NOT_JSON
                async with aclosing(self._live(client, _POP_PAGE)) as live:
                    async for seq, payload in live:
                        removed, item = seq, _decode(payload)
                        if item is not _NOT_JSON:
                            break
                if not removed:
                    return None
                # One marker, which removes the undecodable items above the one it names too (whatever
                # lies between that item and the marker), appended only onto the log as read: another
                # process's item or pop since then (any event) makes this one read again, so a pop
                # removes the newest item, once.
                marker = event(POP, b'{"seq":%d}' % removed)
                try:
                    await client.append_events(self.session_id, [marker], expected_last_seq=last)
                except EventConflictError:
                    continue
                return None if item is _NOT_JSON else cast(TResponseInputItem, item)

    async def _last_seq(self, client: AsyncCheckpointClient) -> int:
        """The session's last event seq, of any type (0: none)."""
        try:
            async with aclosing(self._log(client, (), newest_first=True, page_size=1)) as log:
                async for e in log:
                    return e.seq
        except NotFoundError:
            pass
        return 0

    async def _oldest_seq(self, client: AsyncCheckpointClient) -> int:
        """The seq of the session's oldest item, pop or clear (past any seq: none)."""
        async with aclosing(self._log(client, page_size=1)) as log:
            async for e in log:
                return e.seq
        return _NO_SEQ


def _below(pop: service_pb2.Event, below: int) -> int:
    """Where a read goes on after ``pop``: below the seq it names (if that is older than the pop)."""
    seq = _popped_seq(pop.payload)
    return seq if seq is not None and seq < pop.seq else below


def _batches(events: list[service_pb2.Event], budget: int) -> list[list[service_pb2.Event]]:
    """``events`` in appends of at most MAX_EVENTS_PER_APPEND events and ``budget`` bytes, in order
    (ResourceExhaustedError, before anything is sent, for an event that fits in none)."""
    batches: list[list[service_pb2.Event]] = [[]]
    size = 0
    for i, e in enumerate(events):
        cost = e.ByteSize() + _EVENT_FRAME_BYTES
        if cost > budget:
            raise ResourceExhaustedError(
                f"items[{i}] is {cost} bytes as an event, over the {budget} an append of this client may hold"
                f" (max_message_bytes less {MESSAGE_ENVELOPE_BYTES} for the request's other fields); nothing"
                " was stored",
                grpc.StatusCode.RESOURCE_EXHAUSTED,
            )
        if batches[-1] and (len(batches[-1]) == MAX_EVENTS_PER_APPEND or size + cost > budget):
            batches.append([])
            size = 0
        batches[-1].append(e)
        size += cost
    return batches


def _encode(item: TResponseInputItem) -> bytes:
    try:
        return json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:  # a lone surrogate in a string: escaped, it still reads back the same
        return json.dumps(item, separators=(",", ":")).encode()


def _decode(payload: bytes) -> Any:
    """The item ``payload`` holds (None too: JSON's null), or _NOT_JSON."""
    try:
        return json.loads(payload)
    except ValueError:  # not JSON, or not UTF-8: an event of this type someone else appended
        return _NOT_JSON


def _popped_seq(payload: bytes) -> int | None:
    try:
        seq = json.loads(payload)["seq"]
    except (ValueError, TypeError, KeyError):
        return None
    return seq if type(seq) is int and seq > 0 else None


async def _finish(work: Awaitable[T]) -> T:
    """Await ``work`` to its end even if the caller is cancelled meanwhile, then raise the cancellation:
    a change the caller gave up on is still either made or failed, never left half-known (the SDK's
    sessions promise the same of their writes)."""
    task = asyncio.ensure_future(work)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
    try:
        result = task.result()
    except BaseException:
        if cancelled is not None:
            raise cancelled from None
        raise
    if cancelled is not None:
        raise cancelled
    return result
