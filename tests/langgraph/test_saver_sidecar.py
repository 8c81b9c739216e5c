"""The saver through a real sidecar: no silent forks, a step's cost, namespaces, a prune stopped half-way,
and the errors bad input gets."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langgraph.checkpoint.base import CheckpointTuple, empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.memory import InMemorySaver

from ckpt.sidecar.client import CheckpointClient
from ckpt.sidecar.langgraph import AsyncCkptSaver, CheckpointConflictError, CkptSaver
from ckpt.sidecar.langgraph.backends import ClientBackend
from ckpt.sidecar.langgraph.calls import Call
from ckpt.sidecar.langgraph.records import Where
from tests.support import Sidecar


def thread(thread_id: str, ns: str = "", checkpoint_id: str | None = None) -> Any:
    configurable = {"thread_id": thread_id, "checkpoint_ns": ns}
    if checkpoint_id:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def _checkpoint(values: dict[str, Any], step: int) -> Any:
    checkpoint: Any = empty_checkpoint()
    versions = {k: step + 1 for k in values}
    checkpoint.update(id=str(uuid6(clock_seq=-1)), channel_values=values, channel_versions=versions)
    return checkpoint


def put(saver: Any, config: Any, values: dict[str, Any], step: int) -> Any:
    checkpoint = _checkpoint(values, step)
    versions = checkpoint["channel_versions"]
    return saver.put(config, checkpoint, {"source": "loop", "step": step, "parents": {}}, versions)


def got(saver: Any, config: Any) -> CheckpointTuple:
    found = saver.get_tuple(config)
    assert found is not None, config
    return found  # type: ignore[no-any-return]


def ids(saver: Any, config: Any) -> list[str]:
    return [t.config["configurable"]["checkpoint_id"] for t in saver.list(config)]


def test_a_put_that_lost_a_race_fails_and_hides_no_checkpoint(sidecar: Sidecar) -> None:
    with CkptSaver(sidecar.unix_target) as first, CkptSaver(sidecar.tcp_target) as second:
        head = put(first, thread("raced"), {"n": 0}, 0)
        for saver in (first, second):  # both resume the thread from its head
            assert got(saver, thread("raced")).config == head
        winner = put(first, head, {"n": 1}, 1)
        with pytest.raises(CheckpointConflictError, match="moved on") as lost:
            put(second, head, {"n": 2}, 1)
        assert (
            lost.value.thread_id == "raced" and lost.value.parent_checkpoint_id == head["configurable"]["checkpoint_id"]
        )
        assert ids(second, thread("raced")) == [
            winner["configurable"]["checkpoint_id"],
            head["configurable"]["checkpoint_id"],
        ]
        # Retrying as the error says: read the new head, continue from it.
        resumed = got(second, thread("raced"))
        assert resumed.checkpoint["channel_values"] == {"n": 1}
        put(second, resumed.config, {"n": 2}, 2)
        assert got(first, thread("raced")).checkpoint["channel_values"] == {"n": 2}


def step(saver: Any, config: Any, n: int, messages: list[str]) -> Any:
    checkpoint: Any = empty_checkpoint()
    checkpoint.update(id=str(uuid6(clock_seq=n)), channel_values={"messages": messages})
    checkpoint["channel_versions"] = {"messages": n + 1}
    return saver.put(config, checkpoint, {"source": "loop", "step": n, "parents": {}}, {"messages": n + 1})


@pytest.mark.parametrize("reads_first", [False, True], ids=["own-head", "read-head"])
def test_a_thread_deleted_and_written_again_to_the_same_version_refuses_the_stale_writer(
    sidecar: Sidecar, reads_first: bool
) -> None:
    """Another saver deletes the thread and writes it up to the version the first one holds: the first
    one's next put, which continues its own head, must not merge its step onto the other content."""
    with CkptSaver(sidecar.unix_target) as a, CkptSaver(sidecar.tcp_target) as b:
        config, messages = thread("t"), list[str]()
        for n in range(3):
            messages = [*messages, f"A{n}"]
            config = step(a, config, n, messages)
        if reads_first:  # the head it holds is one it read, not one it wrote
            assert got(a, thread("t")).config == config
        b.delete_thread("t")
        b_config, b_messages = thread("t"), list[str]()
        for n in range(3):
            b_messages = [*b_messages, f"B{n}"]
            b_config = step(b, b_config, 10 + n, b_messages)
        with pytest.raises(CheckpointConflictError) as stale:
            step(a, config, 3, [*messages, "A3"])
        assert (
            stale.value.current_version == 3
            and stale.value.parent_checkpoint_id == config["configurable"]["checkpoint_id"]
        )
        head = got(b, thread("t"))
        assert head.config == b_config and head.checkpoint["channel_values"]["messages"] == b_messages
        assert ids(b, thread("t")) == ids(a, thread("t")) and len(ids(b, thread("t"))) == 3
        # Retrying as the error says: read the new head, continue from it.
        on_b = step(a, got(a, thread("t")).config, 13, [*b_messages, "A3"])
        assert got(b, thread("t")).config == on_b


def test_a_branch_from_an_older_checkpoint_is_written_on_purpose(sidecar: Sidecar) -> None:
    with CkptSaver(sidecar.unix_target) as saver:
        first = put(saver, thread("branched"), {"n": 0}, 0)
        put(saver, first, {"n": 1}, 1)
        branch = put(saver, got(saver, first).config, {"n": 10}, 1)  # time travel, then a step
        latest = got(saver, thread("branched"))
        assert latest.config == branch and latest.parent_config == first
        assert len(ids(saver, thread("branched"))) == 3


def test_a_step_stores_the_message_it_added_not_the_conversation(sidecar: Sidecar) -> None:
    with CkptSaver(sidecar.unix_target) as saver, CheckpointClient(sidecar.unix_target) as client:
        config, messages = thread("conversation"), []
        saver.get_tuple(config)
        for step in range(120):
            messages.append(f"message {step}: " + "lorem ipsum dolor sit amet " * 20)
            config = put(saver, config, {"messages": list(messages), "step": step}, step)
        versions = list(client.history(Where("conversation", "").session_id))
        assert versions[0].state_size > 60_000  # the conversation so far
        # Each later step sent a MERGE patch of its message, and stored little more.
        assert all(v.mode == 2 and v.stored_bytes < 2_000 for v in versions[:100])
        assert got(saver, thread("conversation")).checkpoint["channel_values"]["messages"] == messages


def test_a_threads_namespaces_are_kept_apart(sidecar: Sidecar) -> None:
    with CkptSaver(sidecar.unix_target) as saver:
        root = put(saver, thread("nested"), {"where": "root"}, 0)
        child = put(saver, thread("nested", "tools:1"), {"where": "child"}, 0)
        saver.put_writes(child, [("where", "child write")], "task")
        assert got(saver, thread("nested")).checkpoint["channel_values"] == {"where": "root"}
        child_tuple = got(saver, thread("nested", "tools:1"))
        assert child_tuple.checkpoint["channel_values"] == {"where": "child"}
        assert child_tuple.pending_writes == [("task", "where", "child write")]
        assert got(saver, thread("nested")).pending_writes == []
        listed = {
            t.config["configurable"]["checkpoint_ns"] for t in saver.list({"configurable": {"thread_id": "nested"}})
        }
        assert listed == {"", "tools:1"}
        saver.delete_thread("nested")
        assert saver.get_tuple(root) is None and saver.get_tuple(child) is None


def test_a_prune_stopped_half_way_is_finished_by_the_next_read(sidecar: Sidecar) -> None:
    with CkptSaver(sidecar.unix_target) as saver:
        config = thread("pruned")
        for step in range(3):
            config = put(saver, config, {"n": step}, step)
        saver.put_writes(config, [("n", "pending")], "task")
        where = Where("pruned", "")
        # Run the prune until it removed the namespace, then stop, as a killed process would.
        op = saver._ops._keep_latest(where)
        backend = ClientBackend(CheckpointClient(sidecar.unix_target))
        answer = None
        while True:
            call = op.send(answer)
            assert isinstance(call, Call)
            answer = getattr(backend, call.method)(*call.args)
            if call == Call("delete", (where.session_id,)):
                break
        backend.client.close()
    with CkptSaver(sidecar.unix_target) as fresh:
        latest = got(fresh, thread("pruned"))
        assert latest.config == config and latest.checkpoint["channel_values"] == {"n": 2}
        assert latest.pending_writes == [("task", "n", "pending")]
        assert ids(fresh, thread("pruned")) == [config["configurable"]["checkpoint_id"]]


def test_put_returns_an_int_thread_id_as_given_as_langgraphs_savers_do(sidecar: Sidecar, tmp_path: Any) -> None:
    """put returned the thread id as the str it is stored as; InMemorySaver and SqliteSaver return the
    caller's own (LangGraph takes an int), and a read with either finds the checkpoint."""
    config: Any = {"configurable": {"thread_id": 7, "checkpoint_ns": ""}}
    expected = put(InMemorySaver(), config, {"n": 0}, 0)["configurable"]

    async def put_async() -> Any:
        async with AsyncCkptSaver(sidecar.unix_target) as saver:
            done = await saver.aput(config, _checkpoint({"n": 0}, 0), {"source": "loop", "step": 0}, {"n": 1})
            as_str = thread("7", checkpoint_id=done["configurable"]["checkpoint_id"])
            return done, await saver.aget_tuple(done), await saver.aget_tuple(as_str)

    with CkptSaver(sidecar.unix_target) as on_sidecar, CkptSaver.embedded(tmp_path / "embedded") as embedded:
        for saver in (on_sidecar, embedded):
            done = put(saver, config, {"n": 0}, 0)
            assert {**done["configurable"], "checkpoint_id": None} == {**expected, "checkpoint_id": None}
            assert type(done["configurable"]["thread_id"]) is int
            for read in (done, thread("7", checkpoint_id=done["configurable"]["checkpoint_id"])):
                assert got(saver, read).checkpoint["id"] == done["configurable"]["checkpoint_id"]
    done, *reads = asyncio.run(put_async())
    assert type(done["configurable"]["thread_id"]) is int
    assert [r.checkpoint["id"] for r in reads] == [done["configurable"]["checkpoint_id"]] * 2


def test_bad_input_gets_an_error_naming_the_limit(sidecar: Sidecar) -> None:
    with CkptSaver(sidecar.unix_target) as saver:
        with pytest.raises(ValueError, match="at most 128"):
            put(saver, thread("t" * 129), {"n": 0}, 0)
        too_long = r"^thread_id and checkpoint_ns are 401 bytes of UTF-8 together; ckpt's savers take at most 243 "
        with pytest.raises(ValueError, match=too_long):
            put(saver, thread("t", "n" * 400), {"n": 0}, 0)
        with pytest.raises(ValueError, match=too_long):  # a read names the same limit as the put
            saver.get_tuple(thread("t", "n" * 400))
        with pytest.raises(ValueError, match=r"^thread_id 'a\\nb' contains an ASCII control character"):
            put(saver, thread("a\nb"), {"n": 0}, 0)
        with pytest.raises(ValueError, match=r"^checkpoint_ns 'sub\\x00' contains an ASCII control character"):
            saver.get_tuple(thread("t", "sub\x00"))
        assert list(saver.list(None)) == []  # nothing was stored
        with pytest.raises(ValueError, match="checkpoint_id"):
            saver.put_writes(thread("t"), [("n", 1)], "task")
        with pytest.raises(ValueError, match='"keep_latest" or "delete"'):
            saver.prune(["t"], strategy="everything")
        with pytest.raises(TypeError, match="one of them"):
            CkptSaver()


def test_a_thread_id_holding_a_lone_surrogate_is_refused_naming_it(sidecar: Sidecar) -> None:
    """It was a bare UnicodeEncodeError naming nothing (text decoded with surrogateescape, say)."""
    lone = r"^thread_id '\\ud800' is not valid UTF-8 \(lone surrogate\): ckpt's savers cannot store it$"
    with CkptSaver(sidecar.unix_target) as saver:
        with pytest.raises(ValueError, match=lone):
            put(saver, thread("\ud800"), {"n": 0}, 0)
        with pytest.raises(ValueError, match=lone):
            saver.get_tuple(thread("\ud800"))
        with pytest.raises(ValueError, match=lone):
            list(saver.list({"configurable": {"thread_id": "\ud800"}}))
        with pytest.raises(ValueError, match=lone):
            saver.delete_thread("\ud800")
        with pytest.raises(ValueError, match=r"^checkpoint_ns 'a\\udcff' is not valid UTF-8 \(lone surrogate\)"):
            put(saver, thread("t", "a\udcff"), {"n": 0}, 0)
        assert list(saver.list(None)) == []  # nothing was stored


#: Sessions any client may name: not the saver's (it writes the thread id's length in ASCII digits, no
#: leading zero), though str.isdigit() takes '²' (int() refuses it) and reads Arabic-Indic '٣' as 3.
FOREIGN = {"langgraph/\N{SUPERSCRIPT TWO}/notes": b"a", "langgraph/\u0663/abc/": b"b", "langgraph/01/x/": b"c"}


def test_sessions_another_client_names_langgraph_are_not_the_savers(sidecar: Sidecar) -> None:
    """list(None) raised ValueError once any client had put langgraph/²/..., for every saver user, and
    delete_for_runs did too; langgraph/٣/abc/ was read as thread 'abc'."""
    with CheckpointClient(sidecar.unix_target) as client, CkptSaver(sidecar.unix_target) as saver:
        for session_id, state in FOREIGN.items():
            client.put(session_id, state, labels={"langgraph.thread": "x"})
        checkpoint: Any = empty_checkpoint()
        checkpoint.update(id=str(uuid6(clock_seq=-1)), channel_values={"n": 1}, channel_versions={"n": 1})
        mine = saver.put(thread("abc"), checkpoint, {"source": "loop", "step": 0, "run_id": "run-1"}, {"n": 1})
        assert [t.config for t in saver.list(None)] == [mine]
        assert [t.config for t in saver.list({"configurable": {"thread_id": "x"}})] == []
        saver.delete_for_runs(["run-1"])
        assert list(saver.list(None)) == []
        assert {s: client.get(s).state for s in FOREIGN} == FOREIGN  # untouched


def test_the_asyncio_saver_refuses_sync_calls_from_its_own_loop(sidecar: Sidecar) -> None:
    async def main() -> None:
        async with AsyncCkptSaver(sidecar.unix_target) as saver:
            assert await saver.aget_tuple(thread("async")) is None
            with pytest.raises(RuntimeError, match="cannot be called from its own event loop"):
                saver.get_tuple(thread("async"))
            # From another thread, while the loop runs, they work.
            assert await asyncio.to_thread(saver.get_tuple, thread("async")) is None

    asyncio.run(main())


def test_writes_saved_before_their_checkpoints_put_are_read_with_it(sidecar: Sidecar) -> None:
    """LangGraph saves a task's writes while its checkpoint's put may not have begun."""
    with CkptSaver(sidecar.unix_target) as saver:
        first = put(saver, thread("early"), {"n": 0}, 0)
        saver.put_writes(first, [("n", "late for the first")], "task-0")
        checkpoint: Any = empty_checkpoint()
        checkpoint.update(id=str(uuid6(clock_seq=-1)), channel_values={"n": 1}, channel_versions={"n": 2})
        early = thread("early", checkpoint_id=checkpoint["id"])
        saver.put_writes(early, [("__interrupt__", "approve?"), ("n", "early")], "task-1")
        saved = saver.put(first, checkpoint, {"source": "loop", "step": 1, "parents": {}}, {"n": 2})
        saver.put_writes(saved, [("n", "after")], "task-2")
        assert got(saver, saved).pending_writes == [
            ("task-1", "__interrupt__", "approve?"),
            ("task-1", "n", "early"),
            ("task-2", "n", "after"),
        ]
        with CkptSaver(sidecar.tcp_target) as fresh:
            assert got(fresh, thread("early")).pending_writes == got(saver, saved).pending_writes
            assert got(fresh, first).pending_writes == [("task-0", "n", "late for the first")]


@pytest.mark.parametrize("reads_first", [True, False], ids=["read-then-put", "put-a-branch"])
@pytest.mark.parametrize("rebuild", ["delete", "prune", "delete_for_runs"])
def test_writes_are_kept_after_another_saver_makes_the_threads_log_anew(
    sidecar: Sidecar, rebuild: str, reads_first: bool
) -> None:
    # One saver wrote a thread far into its log; another deleted, pruned or cut it, so that its log began
    # again at seq 1. The first saver's next checkpoint and its pending writes must read back whole, whether
    # it read the thread first (as LangGraph does before a step) or wrote a new branch without reading.
    def step(saver: Any, config: Any, n: int, run: str = "run-a") -> Any:
        checkpoint: Any = empty_checkpoint()
        checkpoint.update(id=str(uuid6(clock_seq=n)), channel_values={"n": n}, channel_versions={"n": n + 1})
        metadata = {"source": "loop", "step": n, "parents": {}, "run_id": run}
        written = saver.put(config, checkpoint, metadata, {"n": n + 1})
        saver.put_writes(written, [("__interrupt__", f"ask {n}"), ("n", n)], f"task-{n}")
        return written

    with CkptSaver(sidecar.unix_target) as first, CkptSaver(sidecar.tcp_target) as second:
        config = thread("remade")
        for n in range(10):
            config = step(first, config, n)
        if rebuild == "delete":
            second.delete_thread("remade")
            step(second, thread("remade"), 100, run="run-b")
        elif rebuild == "prune":
            second.prune(["remade"], strategy="keep_latest")
        else:
            step(second, config, 100, run="run-b")
            second.delete_for_runs(["run-a"])
        parent = got(first, thread("remade")).config if reads_first else thread("remade")
        config = step(first, parent, 101)
        for saver in (first, second, CkptSaver(sidecar.unix_target)):
            found = got(saver, thread("remade"))
            assert found.config == config
            assert found.pending_writes == [("task-101", "__interrupt__", "ask 101"), ("task-101", "n", 101)]


@pytest.mark.parametrize("saver_class", [CkptSaver, AsyncCkptSaver])
def test_a_write_saved_before_its_checkpoint_is_kept_after_another_saver_made_the_thread_anew(
    sidecar: Sidecar, saver_class: Any
) -> None:
    """The first saver remembered a seq far into the thread's old log; the write landed at seq 3 of the new
    one and its checkpoint named a seq it all came after from the old log's count: the write was lost."""

    def new_checkpoint(n: int) -> Any:
        checkpoint: Any = empty_checkpoint()
        checkpoint.update(id=str(uuid6(clock_seq=-1)), channel_values={"n": n}, channel_versions={"n": n + 1})
        return checkpoint

    async def main() -> None:
        async with AsyncCkptSaver(sidecar.unix_target) as async_saver:
            sync_saver = CkptSaver(sidecar.unix_target)
            saver = async_saver if saver_class is AsyncCkptSaver else sync_saver

            async def call(method: str, *args: Any) -> Any:  # the saver's async method, or its sync one
                if saver is async_saver:
                    return await getattr(saver, "a" + method)(*args)
                return getattr(saver, method)(*args)

            with CkptSaver(sidecar.tcp_target) as second:
                old = await call("put", thread("remade"), new_checkpoint(0), {"source": "loop", "step": 0}, {"n": 1})
                for i in range(20):
                    await call("put_writes", old, [("n", i)], f"task-{i}")
                second.delete_thread("remade")
                restarted = put(second, thread("remade"), {"n": 0}, 0)
                checkpoint = new_checkpoint(1)
                early = thread("remade", checkpoint_id=checkpoint["id"])
                await call("put_writes", early, [("__interrupt__", "approve?")], "task-x")
                await call("put", restarted, checkpoint, {"source": "loop", "step": 1, "parents": {}}, {"n": 2})
                assert (await call("get_tuple", early)).pending_writes == [("task-x", "__interrupt__", "approve?")]
                for reader in (second, CkptSaver(sidecar.unix_target)):
                    assert got(reader, early).pending_writes == [("task-x", "__interrupt__", "approve?")]
            sync_saver.close()

    asyncio.run(main())
