"""An asyncio put_blob cancelled mid-stream (its task cancelled, an ``asyncio.wait_for`` timing out), from
bytes or from a file, stores nothing: the blob is NOT_FOUND and the sidecar's partly written file is gone.
The same client goes on serving calls, and no task or exception of the cancelled call is left on the loop."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import io
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, BinaryIO, cast

import pytest

from ckpt.sidecar.client import AsyncCheckpointClient, NotFoundError
from tests.support import Sidecar

# Large, in small chunks: thousands of messages, so the stream is far from its end when it is cancelled.
_SIZE = 64 * 1024 * 1024
_CHUNK = 16 * 1024


class _SlowFile(io.RawIOBase):
    """A blob's file read a chunk at a time, each read taking a millisecond (its 4096 reads: seconds)."""

    def __init__(self, data: bytes) -> None:
        self._data, self._at = memoryview(data), 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        time.sleep(0.001)
        piece = bytes(self._data[self._at : self._at + size])
        self._at += len(piece)
        return piece


def _partial_files(tmp_dir: Path) -> list[Path]:
    return list(tmp_dir.glob("*")) if tmp_dir.exists() else []


async def _until(condition: Callable[[], Any], seconds: float = 5) -> Any:
    """``condition()`` once it is true, or its last value after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not (value := condition()) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return value


async def _cancel_mid_stream(sidecar: Sidecar, source: str, how: str) -> None:
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: unhandled.append(context))
    tmp_dir = sidecar.data_dir / "blobs" / "tmp"
    async with AsyncCheckpointClient(sidecar.unix_target) as client:
        data = os.urandom(_SIZE)
        put: Awaitable[object] = client.put_blob(
            data if source == "bytes" else cast(BinaryIO, _SlowFile(data)), session_id="s", chunk_size_bytes=_CHUNK
        )
        if how == "wait_for":
            put = asyncio.wait_for(put, 0.3)
        task = asyncio.ensure_future(put)
        # The sidecar is writing the blob: the stream is under way.
        assert await _until(lambda: _partial_files(tmp_dir) or task.done()), "the stream never started"
        assert not task.done(), "the whole blob was sent before it could be cancelled"
        if how == "cancel":
            task.cancel()
        (outcome,) = await asyncio.gather(task, return_exceptions=True)
        assert isinstance(outcome, asyncio.CancelledError if how == "cancel" else TimeoutError), outcome

        # Nothing stored, nothing left half written.
        assert await _until(lambda: not _partial_files(tmp_dir)), _partial_files(tmp_dir)
        with pytest.raises(NotFoundError):
            await client.get_blob_to(hashlib.sha256(data).hexdigest(), io.BytesIO())

        # The same client goes on.
        small = await asyncio.wait_for(client.put_blob(b"after", session_id="s"), 5)
        assert [chunk async for chunk in client.get_blob(small)] == [b"after"]
        await asyncio.wait_for(client.put("s", b"state"), 5)
        assert (await asyncio.wait_for(client.get("s"), 5)).state == b"state"
        assert await _until(lambda: not {t for t in asyncio.all_tasks() if t is not asyncio.current_task()})
    gc.collect()  # a call's dropped generator or future would report what it held now
    await asyncio.sleep(0.05)
    assert unhandled == []


@pytest.mark.parametrize("source", ["bytes", "file"])
@pytest.mark.parametrize("how", ["cancel", "wait_for"])
def test_a_put_blob_cancelled_mid_stream_stores_nothing_and_the_client_goes_on(
    sidecar: Sidecar, source: str, how: str
) -> None:
    asyncio.run(_cancel_mid_stream(sidecar, source, how))
