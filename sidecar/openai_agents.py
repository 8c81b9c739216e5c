"""An OpenAI Agents SDK session (the ``agents.memory.Session`` protocol) kept in a ckpt session's event log.

The log is append-only, so a conversation is replayed from it rather than stored as rows: each item the
SDK adds is an ``openai_agents.item`` event (its JSON), ``pop_item`` appends an ``openai_agents.pop``
naming the seq of the item it removes, ``clear_session`` an ``openai_agents.clear``. ``get_items`` reads
the log newest first, skipping popped items and stopping at the last clear, so a ``limit`` reads only the
tail. Other events in the same ckpt session (an agent's own ``tool_call`` log, say) are never read.

Needs the ``openai-agents`` package: ``pip install 'ckpt-sidecar[openai-agents]'``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Awaitable, Sequence
from contextlib import aclosing
from typing import Any, TypeVar, cast

from ckpt.v1 import service_pb2

from .client import AsyncCheckpointClient, EventConflictError, NotFoundError, event
from .client.events import MAX_EVENTS_PER_APPEND

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

T = TypeVar("T")


class CkptSession:
    """Conversation history for ``agents.Runner`` (``Runner.run(agent, input, session=...)``) in ckpt's
    event log, with the semantics of the SDK's own ``SQLiteSession``: items come back in the order added,
    ``limit`` gives the latest N in that order (0: none; negative: all), ``pop_item`` removes and returns
    the newest (None when empty), ``clear_session`` empties it. Every change is durable (committed by the
    sidecar) when its call returns, and finishes even if the caller is cancelled meanwhile.

    ``client`` is an ``AsyncCheckpointClient`` the caller owns (and closes); :meth:`connect` makes a
    session with a client of its own, which :meth:`close` closes. ``session_id`` is the ckpt session the
    events go to (the rules of ``PutRequest.session_id``); an agent's checkpoints may share it.
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
        """A session with an ``AsyncCheckpointClient`` of its own to ``target`` (``unix:PATH`` or
        ``host:port``; None: ``CKPT_TARGET`` and the other variables ``from_env`` reads), made with
        ``client_options`` at the first call, in the event loop that makes it (so ``Runner.run_sync`` may
        use the session too), and closed by :meth:`close`."""
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
        self._lock = asyncio.Lock()  # bound to a loop at its first contended use, not here
        self._closed = False

    async def close(self) -> None:
        """Close the client :meth:`connect` made (a client passed in stays open); calls after it raise
        RuntimeError. Idempotent."""
        self._closed = True
        if self._options is not None and self._client is not None:
            client, self._client = self._client, None
            await client.close()

    async def __aenter__(self) -> CkptSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the Session protocol ---------------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The history, oldest first: all of it, or the latest ``limit`` items (None: the session
        settings' limit). Items whose payload is not JSON are skipped and not counted, as SQLiteSession
        skips rows it cannot decode."""
        client = self._open()
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
                if item is not None:
                    items.append(item)
                    if len(items) == wanted:
                        break
        items.reverse()
        return items

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` (JSON-serializable dicts) in one append: all or none are stored. More than
        1000 items (the sidecar's most per append) go in appends of 1000, in order."""
        client = self._open()
        if not items:
            return
        events = [event(ITEM, _encode(item)) for item in items]  # TypeError before anything is sent
        await _finish(self._append(client, events))

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the newest item and return it; None if there is none."""
        client = self._open()
        return await _finish(self._pop(client))

    async def clear_session(self) -> None:
        """Remove every item (a clear marker: the items stay in the log, unread, until retention or a
        delete of the ckpt session removes them)."""
        client = self._open()
        await _finish(self._append(client, [event(CLEAR)]))

    # -- the log -------------------------------------------------------------------------------------

    def _open(self) -> AsyncCheckpointClient:
        if self._closed:
            raise RuntimeError("CkptSession is closed")
        if self._client is None:
            assert self._options is not None  # only connect() leaves the client to be made
            options = dict(self._options)
            target = options.pop("target", None)
            self._client = (
                AsyncCheckpointClient(target, **options)
                if target is not None
                else AsyncCheckpointClient.from_env(**options)
            )
        return self._client

    def _log(self, client: AsyncCheckpointClient, **filters: Any) -> AsyncGenerator[service_pb2.Event, None]:
        # An async generator, which the readers close when they stop early rather than leave to the GC.
        return cast(AsyncGenerator[service_pb2.Event, None], client.events(self.session_id, **filters))

    async def _live(self, client: AsyncCheckpointClient, page_size: int) -> AsyncGenerator[tuple[int, bytes], None]:
        """(seq, payload) of the items still in the session, newest first."""
        # A pop names an older seq, so newest first every marker is met before the item it removes.
        popped: set[int] = set()
        try:
            async with aclosing(self._log(client, types=_TYPES, newest_first=True, page_size=page_size)) as log:
                async for e in log:
                    if e.type == CLEAR:
                        return
                    if e.type == POP:
                        seq = _popped_seq(e.payload)
                        if seq is not None:
                            popped.add(seq)
                    elif e.seq in popped:
                        popped.discard(e.seq)
                    else:
                        yield e.seq, e.payload
        except NotFoundError:
            return  # no ckpt session of that id yet: an empty conversation

    async def _append(
        self, client: AsyncCheckpointClient, events: Sequence[service_pb2.Event]
    ) -> service_pb2.AppendEventsResponse:
        async with self._lock:  # this object's changes in the order they were called, a pop's read with its write
            reply = service_pb2.AppendEventsResponse()
            for start in range(0, len(events), MAX_EVENTS_PER_APPEND):
                reply = await client.append_events(self.session_id, events[start : start + MAX_EVENTS_PER_APPEND])
            return reply

    async def _pop(self, client: AsyncCheckpointClient) -> TResponseInputItem | None:
        async with self._lock:
            while True:
                last = await self._last_seq(client)
                doomed: list[int] = []  # undecodable items on the way, then the item returned: marked at once
                item: TResponseInputItem | None = None
                async with aclosing(self._live(client, _POP_PAGE)) as live:
                    async for seq, payload in live:
                        doomed.append(seq)
                        item = _decode(payload)
                        if item is not None:
                            break
                if not doomed:
                    return None
                markers = [event(POP, b'{"seq":%d}' % seq) for seq in doomed]
                try:
                    # Only onto the log as read: another process's item or pop since then (any event)
                    # makes this one read again, so a pop removes the newest item, once.
                    await client.append_events(self.session_id, markers, expected_last_seq=last)
                except EventConflictError:
                    continue
                return item

    async def _last_seq(self, client: AsyncCheckpointClient) -> int:
        """The session's last event seq, of any type (0: none)."""
        try:
            async with aclosing(self._log(client, newest_first=True, page_size=1)) as log:
                async for e in log:
                    return e.seq
        except NotFoundError:
            pass
        return 0


def _encode(item: TResponseInputItem) -> bytes:
    try:
        return json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:  # a lone surrogate in a string: escaped, it still reads back the same
        return json.dumps(item, separators=(",", ":")).encode()


def _decode(payload: bytes) -> TResponseInputItem | None:
    try:
        item: TResponseInputItem = json.loads(payload)
    except ValueError:  # not JSON, or not UTF-8: an event of this type someone else appended
        return None
    return item


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
