"""The few store calls the savers' operations make: over the sidecar (sync and asyncio clients) or an
in-process Store.

Each backend method answers one ``Call`` of operations.py. Backends translate the store's answers at this
one boundary: a missing session is None, False or an empty list; a compare-and-set that lost is
``HeadMoved``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import islice

from ckpt.langgraph.v1 import records_pb2
from ckpt.v1 import service_pb2

from ..client import AsyncCheckpointClient, CheckpointClient, ConflictError, EventFilter, NotFoundError, event
from ..descriptors import descriptor_set
from ..errors import NotFound, VersionConflict
from ..store import EventQuery, NewEvent, PutRequest, Store, WriteMode
from .records import CHECKPOINT_EVENT, STEP_TYPE

#: How many versions, sessions or events one page asks for (ReadEvents' largest).
PAGE_SIZE = 1000
#: How many versions one page of a history with states asks for at most: what a page holds in memory.
HISTORY_PAGE_SIZE = 100
Versions = list[tuple[int, dict[str, str]]]
#: A page of a history with states, newest first: version, state.
States = list[tuple[int, bytes]]
Events = list[tuple[str, bytes]]
#: Events read: seq, type, payload.
SeqEvents = list[tuple[int, str, bytes]]
#: A head read with a page of events: its version, its state, the page (None: not read, by a sidecar that
#: predates GetRequest.events), the token of the rest ("": none).
HeadAndEvents = tuple[int, bytes, SeqEvents | None, str]


class HeadMoved(Exception):
    """A compare-and-set write found another head: ``current_version``."""

    def __init__(self, current_version: int) -> None:
        super().__init__(f"the head is version {current_version}")
        self.current_version = current_version


def _put_request(step: bytes, merge: bool, expected_version: int | None, labels: dict[str, str]) -> PutRequest:
    mode = WriteMode.MERGE if merge else WriteMode.REPLACE
    return PutRequest("", step, mode, expected_version, "", labels, STEP_TYPE)


def _wire_put(put: PutRequest) -> service_pb2.PutRequest:
    return service_pb2.PutRequest(
        state=put.state,
        mode=service_pb2.WRITE_MODE_MERGE if put.mode is WriteMode.MERGE else service_pb2.WRITE_MODE_REPLACE,
        expected_version=put.expected_version,
        labels=put.labels,
        message_type=put.message_type,
    )


def _head_and_events(reply: service_pb2.GetResponse) -> HeadAndEvents:
    if not reply.HasField("events"):  # an older sidecar ignored the events asked for: none were read
        return int(reply.version), bytes(reply.state), None, ""
    events = [(int(e.seq), e.type, bytes(e.payload)) for e in reply.events.events]
    return int(reply.version), bytes(reply.state), events, reply.events.next_page_token


def _markers(checkpoint_id: str | None) -> list[tuple[str, bytes]]:
    return [] if checkpoint_id is None else [(CHECKPOINT_EVENT, checkpoint_id.encode())]


class ClientBackend:
    """Through a ``CheckpointClient``: the sidecar."""

    def __init__(self, client: CheckpointClient) -> None:
        self.client = client

    def register(self) -> None:
        self.client.register_type(records_pb2.Step)

    def put(
        self, session_id: str, step: bytes, merge: bool, expected_version: int | None, labels: dict[str, str],
        marker: str | None,
    ) -> tuple[int, int]:  # fmt: skip
        put = _wire_put(_put_request(step, merge, expected_version, labels))
        events = [event(t, p) for t, p in _markers(marker)]
        try:
            reply = self.client.append_events(session_id, events, put=put)
        except ConflictError as exc:
            raise HeadMoved(exc.current_version) from None
        return int(reply.put.version), int(reply.last_seq)

    def append(self, session_id: str, events: Events) -> int:
        return int(self.client.append_events(session_id, [event(t, p) for t, p in events]).last_seq)

    def get(self, session_id: str, version: int, mask: Sequence[str]) -> tuple[int, bytes] | None:
        try:
            reply = self.client.get(session_id, version, field_mask=mask)
        except NotFoundError:
            return None
        return int(reply.version), bytes(reply.state)

    def get_events(self, session_id: str, types: Sequence[str], after_seq: int) -> HeadAndEvents | None:
        read = EventFilter(after_seq=after_seq, types=tuple(types), page_size=PAGE_SIZE)
        try:
            reply = self.client.get(session_id, events=read)
        except NotFoundError:
            return None
        return _head_and_events(reply)

    def versions(self, session_id: str) -> Versions:
        try:
            return [(int(v.version), dict(v.labels)) for v in self.client.history(session_id, page_size=PAGE_SIZE)]
        except NotFoundError:
            return []

    def history(self, session_id: str, start_version: int, page_size: int) -> States:
        listed = self.client.history(session_id, page_size=page_size, include_states=True, start_version=start_version)
        try:
            return [(int(v.version), bytes(v.state)) for v in islice(listed, page_size)]
        except NotFoundError:
            return []

    def events(self, session_id: str, types: Sequence[str], after_seq: int, page_token: str = "") -> SeqEvents:
        pages = self.client.events(
            session_id, types=types, after_seq=after_seq, page_size=PAGE_SIZE, page_token=page_token
        )
        try:
            return [(int(e.seq), e.type, bytes(e.payload)) for e in pages]
        except NotFoundError:
            return []

    def sessions(self, labels: dict[str, str]) -> list[str]:
        return [s.session_id for s in self.client.sessions(labels=labels or None, page_size=PAGE_SIZE)]

    def delete(self, session_id: str) -> bool:
        try:
            self.client.delete(session_id)
        except NotFoundError:
            return False
        return True

    def fork(self, session_id: str, new_session_id: str, labels: dict[str, str]) -> None:
        self.client.fork(session_id, new_session_id, labels=labels, copy_events=True)


class AsyncClientBackend:
    """Through an ``AsyncCheckpointClient``: the sidecar, from asyncio."""

    def __init__(self, client: AsyncCheckpointClient) -> None:
        self.client = client

    async def register(self) -> None:
        await self.client.register_type(records_pb2.Step)

    async def put(
        self, session_id: str, step: bytes, merge: bool, expected_version: int | None, labels: dict[str, str],
        marker: str | None,
    ) -> tuple[int, int]:  # fmt: skip
        put = _wire_put(_put_request(step, merge, expected_version, labels))
        events = [event(t, p) for t, p in _markers(marker)]
        try:
            reply = await self.client.append_events(session_id, events, put=put)
        except ConflictError as exc:
            raise HeadMoved(exc.current_version) from None
        return int(reply.put.version), int(reply.last_seq)

    async def append(self, session_id: str, events: Events) -> int:
        reply = await self.client.append_events(session_id, [event(t, p) for t, p in events])
        return int(reply.last_seq)

    async def get(self, session_id: str, version: int, mask: Sequence[str]) -> tuple[int, bytes] | None:
        try:
            reply = await self.client.get(session_id, version, field_mask=mask)
        except NotFoundError:
            return None
        return int(reply.version), bytes(reply.state)

    async def get_events(self, session_id: str, types: Sequence[str], after_seq: int) -> HeadAndEvents | None:
        read = EventFilter(after_seq=after_seq, types=tuple(types), page_size=PAGE_SIZE)
        try:
            reply = await self.client.get(session_id, events=read)
        except NotFoundError:
            return None
        return _head_and_events(reply)

    async def versions(self, session_id: str) -> Versions:
        try:
            return [
                (int(v.version), dict(v.labels)) async for v in self.client.history(session_id, page_size=PAGE_SIZE)
            ]
        except NotFoundError:
            return []

    async def history(self, session_id: str, start_version: int, page_size: int) -> States:
        listed = self.client.history(session_id, page_size=page_size, include_states=True, start_version=start_version)
        out: States = []
        try:
            async for v in listed:  # a page's worth: the next one is fetched only if this one ended early
                out.append((int(v.version), bytes(v.state)))
                if len(out) == page_size:
                    break
        except NotFoundError:
            return []
        return out

    async def events(self, session_id: str, types: Sequence[str], after_seq: int, page_token: str = "") -> SeqEvents:
        pages = self.client.events(
            session_id, types=types, after_seq=after_seq, page_size=PAGE_SIZE, page_token=page_token
        )
        try:
            return [(int(e.seq), e.type, bytes(e.payload)) async for e in pages]
        except NotFoundError:
            return []

    async def sessions(self, labels: dict[str, str]) -> list[str]:
        return [s.session_id async for s in self.client.sessions(labels=labels or None, page_size=PAGE_SIZE)]

    async def delete(self, session_id: str) -> bool:
        try:
            await self.client.delete(session_id)
        except NotFoundError:
            return False
        return True

    async def fork(self, session_id: str, new_session_id: str, labels: dict[str, str]) -> None:
        await self.client.fork(session_id, new_session_id, labels=labels, copy_events=True)


class StoreBackend:
    """On an in-process ``Store`` (one process owns the data directory)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def register(self) -> None:
        self.store.register_types(descriptor_set(records_pb2.Step))

    def put(
        self, session_id: str, step: bytes, merge: bool, expected_version: int | None, labels: dict[str, str],
        marker: str | None,
    ) -> tuple[int, int]:  # fmt: skip
        events = [NewEvent(t, p) for t, p in _markers(marker)]
        try:
            result = self.store.append_events(
                session_id, events, put=_put_request(step, merge, expected_version, labels)
            )
        except VersionConflict as exc:
            raise HeadMoved(exc.current_version) from None
        assert result.put is not None  # a put was sent
        return result.put.version, result.last_seq

    def append(self, session_id: str, events: Events) -> int:
        return self.store.append_events(session_id, [NewEvent(t, p) for t, p in events]).last_seq

    def get(self, session_id: str, version: int, mask: Sequence[str]) -> tuple[int, bytes] | None:
        # A mask only saves the sidecar's wire; in process, the whole state is as cheap.
        try:
            got = self.store.get(session_id, version)
        except NotFound:
            return None
        return got.version, got.state

    def get_events(self, session_id: str, types: Sequence[str], after_seq: int) -> HeadAndEvents | None:
        query = EventQuery(after_seq=after_seq, types=tuple(types), page_size=PAGE_SIZE)
        try:
            both = self.store.get_with_events(session_id, events=query)
        except NotFound:
            return None
        events = [(e.seq, e.type, e.payload) for e in both.events.events]
        return both.got.version, both.got.state, events, both.events.next_page_token

    def versions(self, session_id: str) -> Versions:
        out: Versions = []
        token = ""
        try:
            while True:
                page, token = self.store.list_versions(session_id, page_size=PAGE_SIZE, page_token=token)
                out += ((v.version, dict(v.labels)) for v in page)
                if not token:
                    return out
        except NotFound:
            return []

    def history(self, session_id: str, start_version: int, page_size: int) -> States:
        try:
            page, _ = self.store.list_versions(
                session_id,
                page_size=page_size,
                include_states=True,
                start_version=start_version,
                max_page_bytes=self.store.config.max_state_bytes,  # what a page holds in memory, as over gRPC
            )
        except NotFound:
            return []
        return [(got.version, got.state) for got in page]

    def events(self, session_id: str, types: Sequence[str], after_seq: int, page_token: str = "") -> SeqEvents:
        def pages() -> Iterator[tuple[int, str, bytes]]:
            token = page_token
            while True:
                query = EventQuery(after_seq=after_seq, types=tuple(types), page_size=PAGE_SIZE, page_token=token)
                page = self.store.read_events(session_id, query)
                yield from ((e.seq, e.type, e.payload) for e in page.events)
                token = page.next_page_token
                if not token:
                    return

        try:
            return list(pages())
        except NotFound:
            return []

    def sessions(self, labels: dict[str, str]) -> list[str]:
        out: list[str] = []
        token = ""
        while True:
            page, token = self.store.list_sessions(page_size=PAGE_SIZE, page_token=token, label_filter=labels or None)
            out += (s.session_id for s in page)
            if not token:
                return out

    def delete(self, session_id: str) -> bool:
        try:
            self.store.delete_session(session_id)
        except NotFound:
            return False
        return True

    def fork(self, session_id: str, new_session_id: str, labels: dict[str, str]) -> None:
        self.store.fork(session_id, 0, new_session_id, labels=labels, copy_events=True)
