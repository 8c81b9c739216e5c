"""What the saver removes and what it can reach: every namespace a put takes is read, listed and pruned;
delete_thread removes writes saved before a namespace's first checkpoint; prune and delete_for_runs refuse
a single id given as a str; delete_thread reads the thread's sessions, not every session."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6

from ckpt.sidecar import Store
from ckpt.sidecar.client import AsyncCheckpointClient, CheckpointClient
from ckpt.sidecar.langgraph import AsyncCkptSaver, CkptSaver
from ckpt.v1 import service_pb2
from tests.langgraph.test_saver_sidecar import got, ids, put, thread
from tests.support import Sidecar

#: A LangGraph subgraph namespace (task ids joined by "|") as long as a put takes for thread "thread-1":
#: its session id is 256 bytes, the limit.
LONGEST_NS = "|".join(f"node{i}:{uuid6()}" for i in range(8))[: 256 - len("langgraph/8/thread-1/")]


def test_every_namespace_a_put_takes_is_read_listed_and_pruned(tmp_path: Path) -> None:
    """The prune's stage of a namespace was 8 bytes longer than its session: a namespace of a session id
    of 249-256 bytes was put, then its get_tuple, list and prune raised ValueError naming that stage."""
    with CkptSaver.embedded(tmp_path / "data") as saver:
        assert saver.get_tuple(thread("thread-1", LONGEST_NS)) is None
        config = thread("thread-1", LONGEST_NS)
        for step in range(3):
            config = put(saver, config, {"n": step}, step)
        saver.put_writes(config, [("n", "pending")], "task")
        assert got(saver, thread("thread-1", LONGEST_NS)).config == config
        assert len(ids(saver, thread("thread-1", LONGEST_NS))) == 3
        assert len(ids(saver, {"configurable": {"thread_id": "thread-1"}})) == 3
        saver.prune(["thread-1"])
        assert ids(saver, thread("thread-1", LONGEST_NS)) == [config["configurable"]["checkpoint_id"]]
        assert got(saver, thread("thread-1", LONGEST_NS)).pending_writes == [("task", "n", "pending")]
        assert saver.get_tuple(thread("thread-1", LONGEST_NS[:-1] + "Z")) is None
        too_long = r"^thread_id and checkpoint_ns are 244 bytes of UTF-8 together; ckpt's savers take at most 243 "
        for call in (
            lambda: put(saver, thread("thread-1", LONGEST_NS + "Z"), {"n": 0}, 0),
            lambda: saver.get_tuple(thread("thread-1", LONGEST_NS + "Z")),
            lambda: list(saver.list(thread("thread-1", LONGEST_NS + "Z"))),
        ):
            with pytest.raises(ValueError, match=too_long):
                call()


def test_delete_thread_removes_writes_saved_before_a_namespaces_first_checkpoint(sidecar: Sidecar) -> None:
    """A namespace's session made by put_writes has no labels (they come with a put): delete_thread, finding
    sessions by label, left its writes, and they came back when that checkpoint was put."""
    with CkptSaver(sidecar.unix_target) as saver:
        kept = put(saver, thread("other"), {"n": 0}, 0)
        saver.put_writes(kept, [("n", "kept")], "task")
        for ns in ("", "sub"):
            checkpoint: Any = empty_checkpoint()
            checkpoint.update(id=str(uuid6(clock_seq=-1)), channel_values={"n": 0}, channel_versions={"n": 1})
            early = thread("gone", ns, checkpoint["id"])
            saver.put_writes(early, [("messages", "secret"), ("__interrupt__", "approve?")], "task-1")
            saver.delete_thread("gone")
            saver.put(thread("gone", ns), checkpoint, {"source": "loop", "step": 0, "parents": {}}, {"n": 1})
            assert got(saver, thread("gone", ns)).pending_writes == []
            saver.delete_thread("gone")
        # Nothing of the thread is left, and another thread's writes are kept.
        saver.put_writes(thread("gone", "tools", str(uuid6(clock_seq=-1))), [("n", "early")], "task")
        saver.prune(["gone"], strategy="delete")
        with CheckpointClient(sidecar.unix_target) as client:
            assert [s.session_id for s in client.sessions()] == ["langgraph/5/other/"]
        assert got(saver, kept).pending_writes == [("task", "n", "kept")]


def test_prune_and_delete_for_runs_refuse_a_single_id_given_as_a_str(tmp_path: Path) -> None:
    """prune("t1", strategy="delete") deleted threads "t" and "1" (a str's characters), and
    delete_for_runs("run-1") the runs "r", "u", "n", "-" and "1"."""
    by_thread = "thread_ids must be a sequence of thread IDs, not a str"
    by_run = "run_ids must be a sequence of run IDs, not a str"
    with CkptSaver.embedded(tmp_path / "data") as saver:
        for thread_id in ("t1", "t", "1"):
            checkpoint: Any = empty_checkpoint()
            checkpoint["id"] = str(uuid6(clock_seq=-1))
            saver.put(thread(thread_id), checkpoint, {"source": "loop", "step": 0, "run_id": "1"}, {})
        for strategy in ("delete", "keep_latest"):
            with pytest.raises(TypeError, match=by_thread):
                saver.prune("t1", strategy=strategy)
        with pytest.raises(TypeError, match=by_run):
            saver.delete_for_runs("run-1")

        async def from_asyncio() -> None:
            with pytest.raises(TypeError, match=by_thread):
                await saver.aprune("t1", strategy="delete")
            with pytest.raises(TypeError, match=by_run):
                await saver.adelete_for_runs("run-1")

        asyncio.run(from_asyncio())
        assert all(saver.get_tuple(thread(t)) is not None for t in ("t1", "t", "1"))
        saver.prune(("t1",), strategy="delete")  # a sequence of them
        assert [saver.get_tuple(thread(t)) is not None for t in ("t1", "t", "1")] == [False, True, True]

    async def async_saver() -> None:
        async with AsyncCkptSaver.embedded(tmp_path / "data") as saver:
            with pytest.raises(TypeError, match=by_thread):
                await saver.aprune("t", strategy="delete")
            with pytest.raises(TypeError, match=by_run):
                await saver.adelete_for_runs("1")
            assert await saver.aget_tuple(thread("t")) is not None and await saver.aget_tuple(thread("1")) is not None

    asyncio.run(async_saver())


#: More unrelated sessions than a listing page of the savers holds (backends.PAGE_SIZE, 1000).
UNRELATED = 2500


def _listed_by(monkeypatch: pytest.MonkeyPatch, client_class: type[Any]) -> list[list[str]]:
    """The session ids of every ListSessions reply ``client_class``'s clients read from now on, by page."""
    pages: list[list[str]] = []
    unary = client_class._unary

    def record(reply: Any) -> Any:
        if isinstance(reply, service_pb2.ListSessionsResponse):
            pages.append([s.session_id for s in reply.sessions])
        return reply

    if asyncio.iscoroutinefunction(unary):

        async def counted_async(self: Any, call: Any) -> Any:
            return record(await unary(self, call))

        monkeypatch.setattr(client_class, "_unary", counted_async)
    else:
        monkeypatch.setattr(client_class, "_unary", lambda self, call: record(unary(self, call)))
    return pages


def _thread_gone_with_early_writes(saver: Any) -> None:
    """Thread "gone": a checkpoint in namespace "", writes saved before any checkpoint in "tools"."""
    put(saver, thread("gone"), {"n": 0}, 0)
    saver.put_writes(thread("gone", "tools", str(uuid6(clock_seq=-1))), [("n", "early")], "task")


GONE = {"langgraph/4/gone/", "langgraph/4/gone/tools"}


def test_delete_thread_reads_the_threads_sessions_and_no_others(
    sidecar: Sidecar, monkeypatch: pytest.MonkeyPatch
) -> None:
    """delete_thread found a namespace holding writes alone in the listing of every session: with 2,500
    unrelated sessions it read three pages of 1,000, each call. It lists the thread's prefix now."""
    with CheckpointClient(sidecar.unix_target) as client:
        puts = (service_pb2.PutRequest(session_id=f"other/{i:05d}", state=b"") for i in range(UNRELATED))
        assert not [r for r in client.put_stream(puts, batch_size=500) if r.HasField("error")]
    with CkptSaver(sidecar.unix_target) as saver:
        _thread_gone_with_early_writes(saver)
        pages = _listed_by(monkeypatch, CheckpointClient)
        saver.delete_thread("gone")
        # A page per lookup (the prunes' stages, the thread's label, its prefix), of the thread's sessions.
        assert len(pages) == 3 and {sid for page in pages for sid in page} == GONE
        monkeypatch.undo()
        _thread_gone_with_early_writes(saver)

    async def from_asyncio() -> list[list[str]]:
        async with AsyncCkptSaver(sidecar.unix_target) as saver:
            pages = _listed_by(monkeypatch, AsyncCheckpointClient)
            await saver.adelete_thread("gone")
            return pages

    pages = asyncio.run(from_asyncio())
    assert len(pages) == 3 and {sid for page in pages for sid in page} == GONE
    with CheckpointClient(sidecar.unix_target) as client:
        assert [s.session_id for s in client.sessions(prefix="langgraph/")] == []
        assert sum(1 for _ in client.sessions()) == UNRELATED


def test_delete_thread_of_an_embedded_saver_lists_the_threads_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    listings: list[dict[str, Any]] = []
    stores: list[Store] = []
    list_sessions = Store.list_sessions

    def recorded(self: Store, **kwargs: Any) -> Any:
        stores.append(self)
        listings.append({k: v for k, v in kwargs.items() if k in ("label_filter", "session_id_prefix") and v})
        return list_sessions(self, **kwargs)

    with CkptSaver.embedded(tmp_path / "data") as saver:
        _thread_gone_with_early_writes(saver)
        put(saver, thread("gone-too"), {"n": 0}, 0)
        monkeypatch.setattr(Store, "list_sessions", recorded)
        saver.delete_thread("gone")
        assert {"session_id_prefix": "langgraph/4/gone/"} in listings and {} not in listings
        assert saver.get_tuple(thread("gone-too")) is not None
        monkeypatch.undo()
        assert [s.session_id for s in stores[0].list_sessions()[0]] == ["langgraph/8/gone-too/"]
