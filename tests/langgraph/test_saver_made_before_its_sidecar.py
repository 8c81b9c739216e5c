"""A saver made before its sidecar serves (a sidecar container starting beside the agent's): making it calls
nothing, a call while the sidecar is down fails as any call does, and the next one, once it serves, works."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from ckpt.sidecar.client import UnavailableError
from ckpt.sidecar.langgraph import AsyncCkptSaver, CkptSaver
from tests.langgraph.test_saver_sidecar import got, put, thread
from tests.support import start_sidecar


def test_a_saver_made_before_its_sidecar_serves_works_once_it_does(tmp_path: Path) -> None:
    socket_path = tmp_path / "late.sock"
    began = time.monotonic()
    with CkptSaver(f"unix:{socket_path}", retries=3, timeout_seconds=5) as saver:
        assert time.monotonic() - began < 1.0  # made without waiting on the sidecar
        with pytest.raises(UnavailableError):
            saver.get_tuple(thread("t"))  # nothing serves yet: the call fails, and registers nothing
        sidecar = start_sidecar(tmp_path / "data", socket_path=socket_path)
        try:
            put(saver, thread("t"), {"messages": ["first"]}, 0)
            assert got(saver, thread("t")).checkpoint["channel_values"] == {"messages": ["first"]}
        finally:
            assert sidecar.stop() == 0, sidecar.log()


def test_an_async_saver_made_before_its_sidecar_serves_works_once_it_does(tmp_path: Path) -> None:
    socket_path = tmp_path / "late.sock"

    async def main() -> None:
        async with AsyncCkptSaver(f"unix:{socket_path}", retries=3, timeout_seconds=5) as saver:
            with pytest.raises(UnavailableError):
                await saver.aget_tuple(thread("t"))
            sidecar = await asyncio.to_thread(start_sidecar, tmp_path / "data", socket_path=socket_path)
            try:
                await asyncio.to_thread(put, saver, thread("t"), {"messages": ["first"]}, 0)
                found = await saver.aget_tuple(thread("t"))
                assert found is not None and found.checkpoint["channel_values"] == {"messages": ["first"]}
            finally:
                assert await asyncio.to_thread(sidecar.stop) == 0, sidecar.log()

    asyncio.run(main())
