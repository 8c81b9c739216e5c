"""The few store calls the savers' operations make, over the sidecar (sync and asyncio clients); on an
in-process Store, storebackend.py makes them (a module of its own: a saver on a sidecar imports no store engine).

Each backend method answers one ``Call`` of operations.py. Backends translate the store's answers at this
one boundary: a missing session is None, False or an empty list; a compare-and-set that lost is
``HeadMoved``. A head read or written comes with its state's XXH3-64 (``state_xxh3``), which a put continuing
it passes as ``expected_xxh3``: compare-and-set on the head's content, not only its version number.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice

from ckpt.langgraph.v1 import records_pb2
from ckpt.v1 import service_pb2

from ..client import (
    AsyncCheckpointClient,
    CheckpointClient,
    ConflictError,
    EventFilter,
    FailedPreconditionError,
    NotFoundError,
    event,
)
from .records import STEP_TYPE

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
#: A version read: its version, its state (masked if asked), its whole state's XXH3-64 (0: a sidecar that
#: predates VersionInfo.state_xxh3).
Got = tuple[int, bytes, int]
#: A put's version, the event log's last seq once it committed, and the state's XXH3-64 (0: as Got's).
Put = tuple[int, int, int]
#: A head read with a page of events: Got (its state None when left out: the one whose XXH3-64 the read
#: named as known), the page (None: not read, by a sidecar that predates GetRequest.events), the token of
#: the rest ("": none).
HeadAndEvents = tuple[int, bytes | None, int, SeqEvents | None, str]


class HeadMoved(Exception):
    """A compare-and-set write found another head: ``current_version``."""

    def __init__(self, current_version: int) -> None:
        super().__init__(f"the head is version {current_version}")
        self.current_version = current_version


def _wire_put(
    step: bytes, merge: bool, expected_version: int | None, expected_xxh3: int | None, labels: dict[str, str]
) -> service_pb2.PutRequest:
    return service_pb2.PutRequest(
        state=step,
        mode=service_pb2.WRITE_MODE_MERGE if merge else service_pb2.WRITE_MODE_REPLACE,
        expected_version=expected_version,
        expected_state_xxh3=expected_xxh3,
        labels=labels,
        message_type=STEP_TYPE,
    )


def _got(reply: service_pb2.GetResponse) -> Got:
    return int(reply.version), bytes(reply.state), int(reply.info.state_xxh3)


def _put(reply: service_pb2.AppendEventsResponse) -> Put:
    return int(reply.put.version), int(reply.log_last_seq), int(reply.put.state_xxh3)


def _head_and_events(reply: service_pb2.GetResponse) -> HeadAndEvents:
    version, state, xxh3 = _got(reply)
    head = version, (None if reply.state_omitted else state), xxh3
    if not reply.HasField("events"):  # an older sidecar ignored the events asked for: none were read
        return *head, None, ""
    events = [(int(e.seq), e.type, bytes(e.payload)) for e in reply.events.events]
    return *head, events, reply.events.next_page_token


class ClientBackend:
    """Through a ``CheckpointClient``: the sidecar."""

    def __init__(self, client: CheckpointClient) -> None:
        self.client = client

    def register(self) -> None:
        self.client.register_type(records_pb2.Step)

    def put(
        self, session_id: str, step: bytes, merge: bool, expected_version: int | None, expected_xxh3: int | None,
        labels: dict[str, str],
    ) -> Put:  # fmt: skip
        put = _wire_put(step, merge, expected_version, expected_xxh3, labels)
        try:
            try:
                reply = self.client.append_events(session_id, [], put=put)
            except FailedPreconditionError:
                # Nothing was written. The likeliest cause: a sidecar that never saw the Step type, restarted
                # on a new, empty data directory after this saver registered it. Any other refusal comes back
                # the same from the second put (registering is idempotent).
                self.register()
                reply = self.client.append_events(session_id, [], put=put)
        except ConflictError as exc:
            raise HeadMoved(exc.current_version) from None
        return _put(reply)

    def append(self, session_id: str, events: Events) -> int:
        return int(self.client.append_events(session_id, [event(t, p) for t, p in events]).last_seq)

    def get(self, session_id: str, version: int, mask: Sequence[str]) -> Got | None:
        try:
            reply = self.client.get(session_id, version, field_mask=mask)
        except NotFoundError:
            return None
        return _got(reply)

    def get_events(
        self, session_id: str, types: Sequence[str], after_seq: int, known_state_xxh3: int | None = None
    ) -> HeadAndEvents | None:
        read = EventFilter(after_seq=after_seq, types=tuple(types), page_size=PAGE_SIZE)
        try:
            reply = self.client.get(session_id, events=read, known_state_xxh3=known_state_xxh3)
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

    def sessions(self, labels: dict[str, str], prefix: str = "") -> list[str]:
        listing = self.client.sessions(labels=labels or None, prefix=prefix, page_size=PAGE_SIZE)
        return [s.session_id for s in listing]

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
        self, session_id: str, step: bytes, merge: bool, expected_version: int | None, expected_xxh3: int | None,
        labels: dict[str, str],
    ) -> Put:  # fmt: skip
        put = _wire_put(step, merge, expected_version, expected_xxh3, labels)
        try:
            try:
                reply = await self.client.append_events(session_id, [], put=put)
            except FailedPreconditionError:  # as ClientBackend.put
                await self.register()
                reply = await self.client.append_events(session_id, [], put=put)
        except ConflictError as exc:
            raise HeadMoved(exc.current_version) from None
        return _put(reply)

    async def append(self, session_id: str, events: Events) -> int:
        reply = await self.client.append_events(session_id, [event(t, p) for t, p in events])
        return int(reply.last_seq)

    async def get(self, session_id: str, version: int, mask: Sequence[str]) -> Got | None:
        try:
            reply = await self.client.get(session_id, version, field_mask=mask)
        except NotFoundError:
            return None
        return _got(reply)

    async def get_events(
        self, session_id: str, types: Sequence[str], after_seq: int, known_state_xxh3: int | None = None
    ) -> HeadAndEvents | None:
        read = EventFilter(after_seq=after_seq, types=tuple(types), page_size=PAGE_SIZE)
        try:
            reply = await self.client.get(session_id, events=read, known_state_xxh3=known_state_xxh3)
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

    async def sessions(self, labels: dict[str, str], prefix: str = "") -> list[str]:
        listing = self.client.sessions(labels=labels or None, prefix=prefix, page_size=PAGE_SIZE)
        return [s.session_id async for s in listing]

    async def delete(self, session_id: str) -> bool:
        try:
            await self.client.delete(session_id)
        except NotFoundError:
            return False
        return True

    async def fork(self, session_id: str, new_session_id: str, labels: dict[str, str]) -> None:
        await self.client.fork(session_id, new_session_id, labels=labels, copy_events=True)
