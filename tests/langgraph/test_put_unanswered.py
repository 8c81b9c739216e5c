"""A put whose call ends unanswered (its task cancelled, as ``asyncio.timeout`` does, or the sidecar gone):
stored or not, the saver finds out before it builds on it. The same put made again keeps the writes saved
before it; a put continuing it continues it if it was stored and is still the head, and raises
CheckpointConflictError if another writer put after it (or after the head it was put after), never writing
past that writer's checkpoint. Real sidecars and embedded stores; a cancellation is made at a chosen point
by holding the saver's store call there."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6

from ckpt.sidecar.client import UnavailableError
from ckpt.sidecar.langgraph import AsyncCkptSaver, CheckpointConflictError, CkptSaver
from tests.support import Sidecar, start_sidecar


def _config(checkpoint_id: str | None = None) -> Any:
    configurable = {"thread_id": "t", "checkpoint_ns": ""}
    if checkpoint_id:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def _checkpoint(n: int) -> Any:
    checkpoint: Any = empty_checkpoint()
    checkpoint.update(id=str(uuid6(clock_seq=n)), channel_values={"n": n}, channel_versions={"n": n})
    return checkpoint


def _metadata(step: int) -> Any:
    return {"source": "loop", "step": step, "parents": {}}


class _HeldPuts:
    """The saver's store calls, passed through, but for its next put: held forever before its call
    (``landed`` False) or after it (True, as a reply lost), until the caller's task is cancelled."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self.hold: bool | None = None  # None: nothing held; else ``landed``
        self.held = asyncio.Event()

    def __getattr__(self, method: str) -> Any:
        call = getattr(self._backend, method)
        if method != "put":
            return call

        async def put(*args: Any) -> Any:
            landed, self.hold = self.hold, None
            if landed is None:
                return await call(*args)
            if landed:
                await call(*args)
            self.held.set()
            await asyncio.Event().wait()  # cancelled here

        return put


async def _cancelled_put(saver: AsyncCkptSaver, held: _HeldPuts, landed: bool, *args: Any) -> None:
    held.hold, held.held = landed, asyncio.Event()
    task = asyncio.ensure_future(saver.aput(*args))
    await held.held.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@contextlib.asynccontextmanager
async def _store(tmp_path: Path, on: str) -> AsyncIterator[tuple[Any, Sidecar | None]]:
    """(a factory of AsyncCkptSavers on one store, the sidecar if ``on`` is "sidecar")."""
    sidecar = start_sidecar(tmp_path / "data") if on == "sidecar" else None
    try:
        if sidecar is not None:
            yield (lambda: AsyncCkptSaver(sidecar.unix_target)), sidecar
        else:
            yield (lambda: AsyncCkptSaver.embedded(tmp_path / "data")), None
    finally:
        if sidecar is not None:
            assert sidecar.stop() == 0, sidecar.log()


def _held(saver: AsyncCkptSaver) -> _HeldPuts:
    held = _HeldPuts(saver._backend)
    saver._backend = held
    return held


@pytest.mark.parametrize("landed", [False, True], ids=["before-its-call", "after-its-call"])
@pytest.mark.parametrize("on", ["sidecar", "embedded"])
def test_a_cancelled_put_made_again_keeps_the_writes_saved_before_it(tmp_path: Path, on: str, landed: bool) -> None:
    async def main() -> None:
        async with _store(tmp_path, on) as (make, _):
            c1, c2 = _checkpoint(1), _checkpoint(2)
            async with make() as saver:
                held = _held(saver)
                r1 = await saver.aput(_config(), c1, _metadata(0), {"n": 1})
                await saver.aput_writes(_config(c2["id"]), [("__interrupt__", "approve?")], "task-1")
                await _cancelled_put(saver, held, landed, r1, c2, _metadata(1), {"n": 2})
                assert await saver.aput(r1, c2, _metadata(1), {"n": 2}) == _config(c2["id"])
                got = await saver.aget_tuple(_config())
                assert got is not None and got.config == _config(c2["id"])
                assert got.pending_writes == [("task-1", "__interrupt__", "approve?")]
            async with make() as fresh:  # another process's view
                got = await fresh.aget_tuple(_config())
                assert got is not None and got.pending_writes == [("task-1", "__interrupt__", "approve?")]
                assert [t.checkpoint["id"] async for t in fresh.alist(_config())] == [c2["id"], c1["id"]]

    asyncio.run(main())


@pytest.mark.parametrize("on", ["sidecar", "embedded"])
def test_a_put_continuing_a_cancelled_put_that_landed_continues_it(tmp_path: Path, on: str) -> None:
    async def main() -> None:
        async with _store(tmp_path, on) as (make, _):
            c1, c2, c3 = _checkpoint(1), _checkpoint(2), _checkpoint(3)
            async with make() as saver:
                held = _held(saver)
                r1 = await saver.aput(_config(), c1, _metadata(0), {"n": 1})
                await _cancelled_put(saver, held, True, r1, c2, _metadata(1), {"n": 2})
                assert await saver.aput(_config(c2["id"]), c3, _metadata(2), {"n": 3}) == _config(c3["id"])
                listed = [(t.checkpoint["id"], (t.parent_config or {}).get("configurable", {}).get("checkpoint_id"))
                          async for t in saver.alist(_config())]  # fmt: skip
                assert listed == [(c3["id"], c2["id"]), (c2["id"], c1["id"]), (c1["id"], None)]
                got = await saver.aget_tuple(_config())
                assert got is not None and got.checkpoint["channel_values"] == {"n": 3}

    asyncio.run(main())


def test_a_put_continuing_a_cancelled_put_another_writer_continued_is_a_conflict(tmp_path: Path) -> None:
    async def main() -> None:
        async with _store(tmp_path, "sidecar") as (make, _):
            c1, c2, other, c3 = _checkpoint(1), _checkpoint(2), _checkpoint(3), _checkpoint(4)
            async with make() as saver, make() as writer:
                held = _held(saver)
                r1 = await saver.aput(_config(), c1, _metadata(0), {"n": 1})
                await _cancelled_put(saver, held, True, r1, c2, _metadata(1), {"n": 2})
                assert (await writer.aget_tuple(_config())).config == _config(c2["id"])
                await writer.aput(_config(c2["id"]), other, _metadata(2), {"n": 3})
                with pytest.raises(CheckpointConflictError, match=f"continued checkpoint '{c2['id']}'"):
                    await saver.aput(_config(c2["id"]), c3, _metadata(2), {"n": 4})
                # Nothing written past the other writer's checkpoint, which stays the head.
                assert [t.checkpoint["id"] async for t in writer.alist(_config())] == [other["id"], c2["id"], c1["id"]]
                got = await saver.aget_tuple(_config())
                assert got is not None and got.checkpoint["channel_values"] == {"n": 3}

    asyncio.run(main())


@pytest.mark.parametrize("other_writer", [True, False], ids=["another-writer-since", "nothing-since"])
def test_a_put_continuing_a_put_failed_before_it_was_stored(tmp_path: Path, other_writer: bool) -> None:
    """With another writer's put since, a conflict (its checkpoint stays the head); with nothing put since, a
    branch after the head, as a put after a checkpoint no store holds (InMemorySaver takes it too)."""
    data, sock = tmp_path / "data", tmp_path / "ckpt.sock"
    sidecar = start_sidecar(data, socket_path=sock)
    c1, c2, other, c3 = _checkpoint(1), _checkpoint(2), _checkpoint(3), _checkpoint(4)
    try:
        with CkptSaver(sidecar.unix_target) as saver:
            r1 = saver.put(_config(), c1, _metadata(0), {"n": 1})
            assert sidecar.stop() == 0, sidecar.log()
            with pytest.raises(UnavailableError):
                saver.put(r1, c2, _metadata(1), {"n": 2})
            sidecar = start_sidecar(data, socket_path=sock)
            if other_writer:
                with CkptSaver(sidecar.unix_target) as writer:
                    writer.put(r1, other, _metadata(1), {"n": 3})
                with pytest.raises(CheckpointConflictError):
                    saver.put(_config(c2["id"]), c3, _metadata(2), {"n": 4})
                assert [t.checkpoint["id"] for t in saver.list(_config())] == [other["id"], c1["id"]]
                return
            assert saver.put(_config(c2["id"]), c3, _metadata(2), {"n": 4}) == _config(c3["id"])
            got = saver.get_tuple(_config())
            assert got is not None and got.parent_config == _config(c2["id"])
            assert [t.checkpoint["id"] for t in saver.list(_config())] == [c3["id"], c1["id"]]
    finally:
        assert sidecar.stop() == 0, sidecar.log()
