"""The savers' store calls on an in-process Store (``CkptSaver.embedded``): imported only by ``embedded``, so
that a saver on a sidecar loads no store engine. backends.py has the same calls over the sidecar."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from ckpt.langgraph.v1 import records_pb2

from ..config import StoreConfig
from ..descriptors import descriptor_set
from ..errors import NotFound, VersionConflict
from ..store import EventQuery, NewEvent, PutRequest, Store, WriteMode
from .backends import PAGE_SIZE, Events, Got, HeadAndEvents, HeadMoved, Put, SeqEvents, States, Versions
from .records import STEP_TYPE


def _put_request(
    step: bytes, merge: bool, expected_version: int | None, expected_xxh3: int | None, labels: dict[str, str]
) -> PutRequest:
    mode = WriteMode.MERGE if merge else WriteMode.REPLACE
    return PutRequest("", step, mode, expected_version, "", labels, STEP_TYPE, expected_xxh3)


class StoreBackend:
    """On an in-process ``Store`` (one process owns the data directory)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @classmethod
    def open(cls, data_dir: str | Path) -> StoreBackend:
        """On a store opened in ``data_dir`` (created if missing); its ``store.close`` closes it."""
        return cls(Store(StoreConfig(data_dir=Path(data_dir))))

    def register(self) -> None:
        self.store.register_types(descriptor_set(records_pb2.Step))

    def put(
        self, session_id: str, step: bytes, merge: bool, expected_version: int | None, expected_xxh3: int | None,
        labels: dict[str, str],
    ) -> Put:  # fmt: skip
        put = _put_request(step, merge, expected_version, expected_xxh3, labels)
        try:
            result = self.store.append_events(session_id, (), put=put)
        except VersionConflict as exc:
            raise HeadMoved(exc.current_version) from None
        assert result.put is not None  # a put was sent
        return result.put.version, result.log_last_seq, result.put.state_xxh3

    def append(self, session_id: str, events: Events) -> int:
        return self.store.append_events(session_id, [NewEvent(t, p) for t, p in events]).last_seq

    def get(self, session_id: str, version: int, mask: Sequence[str]) -> Got | None:
        # A mask only saves the sidecar's wire; in process, the whole state is as cheap.
        try:
            got = self.store.get(session_id, version)
        except NotFound:
            return None
        return got.version, got.state, got.info.state_xxh3

    def get_events(
        self, session_id: str, types: Sequence[str], after_seq: int, known_state_xxh3: int | None = None
    ) -> HeadAndEvents | None:
        query = EventQuery(after_seq=after_seq, types=tuple(types), page_size=PAGE_SIZE)
        # The state the caller holds is the cached head's: left out, as the sidecar's reply leaves it out,
        # rather than copied out of the cache to be dropped.
        info = None if known_state_xxh3 is None else self.store.cached_info(session_id)
        head: tuple[int, bytes | None, int]
        try:
            if info is not None and known_state_xxh3 is not None and info.has_state(known_state_xxh3):
                page = self.store.read_events(session_id, query)
                head = info.version, None, info.state_xxh3
            else:
                both = self.store.get_with_events(session_id, events=query)
                page, head = both.events, (both.got.version, both.got.state, both.got.info.state_xxh3)
        except NotFound:
            return None
        return *head, [(e.seq, e.type, e.payload) for e in page.events], page.next_page_token

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

    def sessions(self, labels: dict[str, str], prefix: str = "") -> list[str]:
        out: list[str] = []
        token = ""
        while True:
            page, token = self.store.list_sessions(
                page_size=PAGE_SIZE, page_token=token, label_filter=labels or None, session_id_prefix=prefix
            )
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
