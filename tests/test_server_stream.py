"""PutStream's handler, in-process on a real store: what happens when a stream ends early.

The sidecar tests drive PutStream through a real process; ending a stream at
a chosen point between the reader and the answers needs the handler itself.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncGenerator, AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

from ckpt.v1 import service_pb2
from sidecar import Store, StoreConfig
from sidecar.metrics import Metrics
from sidecar.server import CheckpointService

from .test_store import CHAINS, state_of


def test_an_abandoned_stream_commits_its_queued_writes_and_logs_nothing(tmp_path: Path) -> None:
    config = StoreConfig(data_dir=tmp_path / "data", chain_policy=CHAINS, sweep_interval_seconds=3600)
    reported: list[dict[str, Any]] = []

    async def main(store: Store) -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: reported.append(context))
        second_sent = asyncio.Event()

        async def requests() -> AsyncIterator[service_pb2.PutStreamRequest]:
            yield service_pb2.PutStreamRequest(
                batch_id=0, puts=[service_pb2.PutRequest(session_id="s", state=state_of("s", 1))]
            )
            # Two conflicts (their futures fail) and one good write, never answered.
            yield service_pb2.PutStreamRequest(
                batch_id=1,
                puts=[
                    service_pb2.PutRequest(session_id="s", state=state_of("s", 9), expected_version=7),
                    service_pb2.PutRequest(session_id="t", state=state_of("t", 1)),
                    service_pb2.PutRequest(session_id="s", state=state_of("s", 9), expected_version=8),
                ],
            )
            second_sent.set()
            await asyncio.Event().wait()  # the client keeps the stream open, then goes away

        with ThreadPoolExecutor(2) as pool:
            service = CheckpointService(store, Metrics(), pool)
            answers = cast(AsyncGenerator[service_pb2.PutStreamResponse, None], service.PutStream(requests(), None))
            first = await answers.__anext__()
            assert [r.response.version for r in first.results] == [1]
            await second_sent.wait()
            await asyncio.sleep(0)  # the reader queues batch 1's writes
            await answers.aclose()  # the stream ends before batch 1 is answered
            while store.get_cached("t") is None:  # batch 1 commits all the same
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # its outcomes are settled on this loop
            gc.collect()

    with Store(config) as store:
        asyncio.run(main(store))
        assert store.get("t").state == state_of("t", 1)
        assert store.get("s").version == 1
    assert not reported, [c.get("message") for c in reported]
