"""A sidecar whose store trains its event dictionary while it serves: the gRPC process, which opened its
reader before the store had one, reads the blocks made with it (inlineevents.py), and so does a restart."""

from __future__ import annotations

import random
from pathlib import Path

from ckpt.sidecar import EventQuery, Store, StoreConfig
from ckpt.sidecar.store.eventdicts import EVENT_DICTIONARY_KEY, TRAIN_SAMPLE_BYTES
from ckpt.sidecar.store.events import DICTIONARY_FORMAT
from ckpt.v1 import service_pb2
from tests.store.test_event_dictionary import message
from tests.support import checkpoint_stub, metered_sidecar, metric, start_sidecar, wait_for_metrics

READ_HERE = 'ckpt_read_by_grpc_process_total{rpc="ReadEvents"}'
SESSIONS = 24


def _newest(stub: object, session: str) -> list[bytes]:
    request = service_pb2.ReadEventsRequest(session_id=session, newest_first=True, page_size=50)
    return [e.payload for e in stub.ReadEvents(request, timeout=10).events]  # type: ignore[attr-defined]


def test_reads_in_the_grpc_process_and_after_a_restart_find_the_dictionary(tmp_path: Path) -> None:
    rng = random.Random(1)
    data = tmp_path / "data"
    logs: dict[str, list[bytes]] = {f"agent-{i}": [] for i in range(SESSIONS)}
    with metered_sidecar(data) as sidecar, checkpoint_stub(sidecar.unix_target) as stub:
        total = 0
        while total < 2 * TRAIN_SAMPLE_BYTES:
            for session, log in logs.items():
                payload = message(rng, len(log))
                stub.AppendEvents(
                    service_pb2.AppendEventsRequest(
                        session_id=session, events=[service_pb2.Event(type="message", payload=payload)]
                    ),
                    timeout=10,
                )
                log.append(payload)
                total += len(payload)
        for i in range(4):  # sessions begun after the dictionary: every block of theirs starts from it
            late = logs[f"late-{i}"] = [message(rng, n) for n in range(12)]
            for payload in late:
                stub.AppendEvents(
                    service_pb2.AppendEventsRequest(
                        session_id=f"late-{i}", events=[service_pb2.Event(type="message", payload=payload)]
                    ),
                    timeout=10,
                )
        before = metric(sidecar, READ_HERE, missing=0)
        for session, log in logs.items():
            assert _newest(stub, session) == log[::-1][:50]
        wait_for_metrics(lambda: metric(sidecar, READ_HERE, missing=0) >= before + len(logs))
    with Store(StoreConfig(data_dir=data), readonly=True) as store:
        assert store.tables.meta is not None and store.tables.events is not None
        with store.read() as txn:
            assert txn.get(EVENT_DICTIONARY_KEY, db=store.tables.meta) is not None
            formats = [v[2] for k, v in txn.scan(store.tables.events) if bytes(k).startswith(b"late-")]
            assert len(formats) >= 4 and set(formats) == {DICTIONARY_FORMAT}
        assert [e.payload for e in store.read_events("agent-3", EventQuery(page_size=1000)).events] == logs["agent-3"]
    again = start_sidecar(data)
    try:
        with checkpoint_stub(again.unix_target) as stub:
            for session, log in logs.items():
                assert _newest(stub, session) == log[::-1][:50]
    finally:
        assert again.stop() == 0, again.log()
