"""copy_thread copies into a new thread only: a target with checkpoints is refused and left as it was (the
copies would have become its newest, hiding its own later checkpoints), and once deleted takes the copy."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6

from ckpt.sidecar.langgraph import AsyncCkptSaver, CkptSaver
from tests.langgraph.test_saver_sidecar import got, ids, put, thread
from tests.support import Sidecar


def _histories(saver: CkptSaver) -> None:
    config = thread("source")
    for step in range(3):
        config = put(saver, config, {"n": step}, step)
    saver.put_writes(config, [("n", "pending")], "task")
    put(saver, thread("target"), {"n": 100}, 0)
    put(saver, thread("target", "sub"), {"n": 200}, 0)


def _copy_is_refused_then_taken(saver: CkptSaver) -> None:
    _histories(saver)
    before = ids(saver, {"configurable": {"thread_id": "target"}})
    with pytest.raises(ValueError, match="copy_thread: thread 'target' already has checkpoints; copy into a new"):
        saver.copy_thread("source", "target")
    assert ids(saver, {"configurable": {"thread_id": "target"}}) == before
    assert got(saver, thread("target")).checkpoint["channel_values"] == {"n": 100}
    saver.delete_thread("target")
    saver.copy_thread("source", "target")
    assert ids(saver, thread("target")) == ids(saver, thread("source"))
    copied, source = got(saver, thread("target")), got(saver, thread("source"))
    assert copied.checkpoint == source.checkpoint and copied.pending_writes == source.pending_writes
    assert saver.get_tuple(thread("target", "sub")) is None  # the deleted namespace stayed deleted


def test_copy_thread_onto_a_thread_with_checkpoints_is_refused_embedded(tmp_path: Path) -> None:
    with CkptSaver.embedded(tmp_path / "data") as saver:
        _copy_is_refused_then_taken(saver)


def test_copy_thread_onto_a_thread_with_checkpoints_is_refused_through_the_sidecar(sidecar: Sidecar) -> None:
    with CkptSaver(sidecar.unix_target) as saver:
        _copy_is_refused_then_taken(saver)


def test_acopy_thread_onto_a_thread_with_checkpoints_is_refused(sidecar: Sidecar) -> None:
    async def copies() -> None:
        async with AsyncCkptSaver.from_conn_string(sidecar.unix_target) as saver:
            for name in ("target", "source"):
                checkpoint: Any = empty_checkpoint()
                checkpoint.update(id=str(uuid6(clock_seq=-1)), channel_values={"n": 1}, channel_versions={"n": 1})
                await saver.aput(thread(name), checkpoint, {"source": "input", "step": -1, "parents": {}}, {"n": 1})
            with pytest.raises(ValueError, match="thread 'target' already has checkpoints"):
                await saver.acopy_thread("source", "target")
            await saver.acopy_thread("source", "fresh")
            copied = await saver.aget_tuple(thread("fresh"))
            assert copied is not None and copied.checkpoint["channel_values"] == {"n": 1}

    asyncio.run(copies())
