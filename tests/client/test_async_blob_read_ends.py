"""An asyncio blob read the caller stops (a break out of ``get_blob``, its task cancelled while reading, a
cancelled ``get_blob_to``) ends its stream then: the sidecar holds the blob file open no longer, and no
grpc.aio task of it is left on the client, which stays open and usable."""

from __future__ import annotations

import asyncio
import io
import os
import time
from collections.abc import Awaitable, Callable

from ckpt.bench.output import process_and_children
from ckpt.sidecar.client import AsyncCheckpointClient
from ckpt.v1 import checkpoint_pb2
from tests.support import Sidecar

# Large enough that the sidecar is still sending (held by flow control) when the caller stops.
_BLOB = os.urandom(1024) * (24 * 1024)
_READS = 8


def _open_blob_files(sidecar: Sidecar) -> int:
    """Files under the data directory's blob store open in the sidecar's processes."""
    count = 0
    for pid in process_and_children(sidecar.pid):
        try:
            names = os.listdir(f"/proc/{pid}/fd")
        except FileNotFoundError:
            continue
        for name in names:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{name}")
            except FileNotFoundError:
                continue
            if "/blobs/" in target:
                count += 1
    return count


def _other_tasks() -> set[asyncio.Task[object]]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


async def _settled(sidecar: Sidecar) -> tuple[int, int]:
    """Blob files the sidecar holds open and tasks pending on the loop, once both reach 0 or 5 s pass."""
    deadline = time.monotonic() + 5
    while True:
        await asyncio.sleep(0.05)
        files, tasks = _open_blob_files(sidecar), len(_other_tasks())
        if (files == 0 and tasks == 0) or time.monotonic() > deadline:
            return files, tasks


async def _stop_reads(
    sidecar: Sidecar, stop: Callable[[AsyncCheckpointClient, checkpoint_pb2.ArtifactRef], Awaitable[None]]
) -> None:
    async with AsyncCheckpointClient(sidecar.unix_target) as client:
        ref = await client.put_blob(_BLOB, session_id="s")
        assert await _settled(sidecar) == (0, 0)
        for _ in range(_READS):
            await stop(client, ref)
        assert await _settled(sidecar) == (0, 0)
        # The client still reads whole blobs.
        assert await client.get_blob_to(ref, io.BytesIO()) == len(_BLOB)


async def _break_after_first_chunk(client: AsyncCheckpointClient, ref: checkpoint_pb2.ArtifactRef) -> None:
    async for _ in client.get_blob(ref):
        break


async def _cancel_while_reading(client: AsyncCheckpointClient, ref: checkpoint_pb2.ArtifactRef) -> None:
    first = asyncio.Event()

    async def read() -> None:
        async for _ in client.get_blob(ref):
            first.set()
            await asyncio.sleep(10)  # cancelled here, in the loop's body

    task = asyncio.ensure_future(read())
    await first.wait()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()


async def _cancel_get_blob_to(client: AsyncCheckpointClient, ref: checkpoint_pb2.ArtifactRef) -> None:
    class Slow(io.BytesIO):
        def write(self, b: object) -> int:
            time.sleep(0.01)
            return super().write(b)  # type: ignore[arg-type]

    task = asyncio.ensure_future(client.get_blob_to(ref, Slow()))
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()


def test_a_break_out_of_get_blob_ends_its_stream(sidecar: Sidecar) -> None:
    asyncio.run(_stop_reads(sidecar, _break_after_first_chunk))


def test_a_task_cancelled_while_reading_get_blob_ends_its_stream(sidecar: Sidecar) -> None:
    asyncio.run(_stop_reads(sidecar, _cancel_while_reading))


def test_a_cancelled_get_blob_to_ends_its_stream(sidecar: Sidecar) -> None:
    asyncio.run(_stop_reads(sidecar, _cancel_get_blob_to))
