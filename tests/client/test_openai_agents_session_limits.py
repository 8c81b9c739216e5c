"""CkptSession at its edges, against a real sidecar and, where it has the same case, the SDK's SQLiteSession:
JSON's null as an item, pops past more undecodable items than one append holds, threads each with an event
loop of its own, a turn bigger than one gRPC message, long runs of pops, and retention below a pop."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner, SQLiteSession, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt.sidecar.client import AsyncCheckpointClient, ResourceExhaustedError, event
from ckpt.sidecar.openai_agents import ITEM, POP, CkptSession
from ckpt.v1 import service_pb2
from tests.client.openai_agents_agent import RUN_CONFIG
from tests.support import Sidecar, start_sidecar

Scenario = Callable[[AsyncCheckpointClient], Awaitable[None]]


def run(target: str, scenario: Scenario, **options: Any) -> None:
    async def main() -> None:
        async with AsyncCheckpointClient(target, **options) as client:
            await scenario(client)

    asyncio.run(main())


def user(*texts: str) -> list[Any]:
    return [{"role": "user", "content": text} for text in texts]


def corrupt(oracle: SQLiteSession, count: int) -> None:
    """``count`` rows that are not JSON at the end of ``oracle``, as the SDK's own tests make them."""
    with oracle._locked_connection() as conn:
        conn.executemany(
            f"INSERT INTO {oracle.messages_table} (session_id, message_data) VALUES (?, ?)",
            [(oracle.session_id, "not json {{{")] * count,
        )
        conn.commit()


def test_a_null_item_is_stored_read_and_popped_as_sqlite_session_does(sidecar: Sidecar) -> None:
    async def scenario(client: AsyncCheckpointClient) -> None:
        oracle = SQLiteSession("null")
        sessions: list[Any] = [CkptSession("null", client=client), oracle]
        for session in sessions:
            await session.add_items([{"a": 1}, None, {"b": 2}, None])
            assert await session.get_items() == [{"a": 1}, None, {"b": 2}, None]
            assert await session.get_items(limit=2) == [{"b": 2}, None]
            assert await session.pop_item() is None  # the null, and only it
            assert await session.get_items() == [{"a": 1}, None, {"b": 2}]
            assert await session.pop_item() == {"b": 2}
            assert await session.pop_item() is None
            assert await session.get_items() == [{"a": 1}]
        oracle.close()

    run(sidecar.unix_target, scenario)


def test_a_pop_past_more_undecodable_items_than_one_append_holds(sidecar: Sidecar) -> None:
    async def scenario(client: AsyncCheckpointClient) -> None:
        oracle = SQLiteSession("garbage")
        sessions: list[Any] = [CkptSession("garbage", client=client), oracle]
        for session in sessions:
            await session.add_items(user("first", "second"))
        for size in (1000, 1):  # 1001 events of the item type that are not JSON, above "second"
            await client.append_events("garbage", [event(ITEM, b"not json {{{")] * size)
        corrupt(oracle, 1001)
        for session in sessions:
            assert await session.get_items() == user("first", "second")
            assert await session.pop_item() == user("second")[0]
            assert await session.get_items() == user("first")
        # One marker removes the item it names and the 1001 above it: one append, all or none.
        assert [e.payload async for e in client.events("garbage", types=(POP,))] == [b'{"seq":2}']
        await client.append_events("garbage", [event(ITEM, b"\xff\xfe")] * 3)
        corrupt(oracle, 3)
        for session in sessions:
            assert await session.pop_item() == user("first")[0]
            assert await session.pop_item() is None and await session.get_items() == []
        oracle.close()

    run(sidecar.unix_target, scenario)


def test_one_session_serves_threads_each_with_an_event_loop_of_its_own(sidecar: Sidecar) -> None:
    """As the SDK tests SQLiteSession: ten threads, each running its own loop, adding to one session;
    then asyncio.run after asyncio.run on the same session."""
    mine = CkptSession.connect("threads", sidecar.unix_target)
    oracle = SQLiteSession("threads")
    sessions: list[Any] = [mine, oracle]
    for session in sessions:
        results: dict[int, str] = {}

        def add(i: int, session: Any = session, results: dict[int, str] = results) -> None:
            try:
                asyncio.run(session.add_items(user(f"thread {i}")))
                results[i] = "ok"
            except Exception as exc:  # reported below, by thread
                results[i] = f"{type(exc).__name__}: {exc}"

        threads = [threading.Thread(target=add, args=(i,), daemon=True) for i in range(10)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert results == dict.fromkeys(range(10), "ok"), type(session).__name__
        stored: list[Any] = asyncio.run(session.get_items())
        assert sorted(item["content"] for item in stored) == sorted(f"thread {i}" for i in range(10))
        assert asyncio.run(session.pop_item()) == stored[-1]  # in the order the adds were committed
        assert asyncio.run(session.get_items()) == stored[:-1]
    asyncio.run(mine.close())
    oracle.close()
    with pytest.raises(RuntimeError, match="CkptSession is closed"):
        asyncio.run(mine.get_items())


def test_a_session_on_a_client_of_another_loop_fails_by_name(sidecar: Sidecar) -> None:
    async def scenario(client: AsyncCheckpointClient) -> None:
        session = CkptSession("borrowed", client=client)
        await session.add_items(user("one"))
        failed: list[BaseException] = []

        def elsewhere() -> None:
            try:
                asyncio.run(session.add_items(user("two")))
            except RuntimeError as exc:
                failed.append(exc)

        thread = threading.Thread(target=elsewhere, daemon=True)
        thread.start()
        await asyncio.to_thread(thread.join, 30)
        assert not thread.is_alive() and len(failed) == 1
        assert "belongs to the event loop it was created in" in str(failed[0])
        assert await session.get_items() == user("one")

    run(sidecar.unix_target, scenario)


@function_tool
def read_file(n: int) -> str:
    """A file's text: 300 KB."""
    return str(n) * 300_000


def test_a_turn_bigger_than_one_message_is_stored(tmp_path: Path) -> None:
    """Four tool results of 300 KB each, where messages hold 1 MiB: each item fits in an append, all of
    them do not."""

    async def turn(session: Any) -> list[Any]:
        model = ScriptedModel()
        model.enqueue([function_call("read_file", {"n": i}, call_id=f"c{i}") for i in range(4)])
        model.enqueue([assistant_message("done")])
        agent = Agent(name="reader", model=model, tools=[read_file])
        result = await Runner.run(agent, "read four files", session=session, run_config=RUN_CONFIG)
        assert result.final_output == "done"
        return list(await session.get_items())

    async def scenario(client: AsyncCheckpointClient) -> None:
        oracle = SQLiteSession("big")
        expected = await turn(oracle)
        oracle.close()
        stored = await turn(CkptSession("big", client=client))
        assert len(stored) == 10 and [i.get("output") for i in stored] == [i.get("output") for i in expected]
        too_big: list[Any] = user("fits", "x" * 2_000_000)
        with pytest.raises(ResourceExhaustedError, match=r"items\[1\] is \d+ bytes as an event.*nothing was stored"):
            await CkptSession("big", client=client).add_items(too_big)
        assert await CkptSession("big", client=client).get_items() == stored

    sidecar = start_sidecar(tmp_path / "data", "--max-message-bytes", str(1024 * 1024))
    try:
        run(sidecar.unix_target, scenario, max_message_bytes=1024 * 1024)
    finally:
        assert sidecar.stop() == 0, sidecar.log()


class Counting(AsyncCheckpointClient):
    """A client that counts the events its reads hand out."""

    read = 0

    def events(self, session_id: str, **filters: Any) -> AsyncIterator[service_pb2.Event]:
        pages = super().events(session_id, **filters)

        async def counted() -> AsyncIterator[service_pb2.Event]:
            async with aclosing(pages):  # type: ignore[type-var]
                async for e in pages:
                    self.read += 1
                    yield e

        return counted()


def test_a_pop_reads_as_little_after_many_pops_as_after_few(sidecar: Sidecar) -> None:
    async def scenario(client: AsyncCheckpointClient) -> None:
        counting = Counting(sidecar.unix_target, own_connection=True)
        async with counting:
            session = CkptSession("pops", client=counting)
            await session.add_items(user(*map(str, range(600))))

            async def cost(call: Awaitable[Any]) -> tuple[Any, int]:
                before = counting.read
                result = await call
                return result, counting.read - before

            for _ in range(10):
                await session.pop_item()
            early = await cost(session.pop_item())
            for _ in range(400):
                await session.pop_item()
            late = await cost(session.pop_item())
            assert early[0] == user("589")[0] and late[0] == user("188")[0]
            assert late[1] <= early[1] <= 40, (early, late)  # not 800 events: two per pop before it
            got, read = await cost(session.get_items(limit=3))
            assert got == user("185", "186", "187") and read <= 40

    run(sidecar.unix_target, scenario)


def test_pops_far_below_the_tail_pass_earlier_pops_and_stop_at_a_clear(sidecar: Sidecar) -> None:
    """Runs of pops long enough that a pop reads below the tail's page, where earlier pops and a clear lie."""

    async def scenario(client: AsyncCheckpointClient) -> None:
        oracle = SQLiteSession("cleared")
        sessions: list[Any] = [CkptSession("cleared", client=client), oracle]
        for session in sessions:
            await session.add_items(user(*map(str, range(5))))
            await session.clear_session()
        await client.append_events("cleared", [event("tool_call", b"{}")] * 100)
        for session in sessions:
            await session.add_items(user(*map(str, range(20))))
            assert [await session.pop_item() for _ in range(5)] == user(*map(str, range(19, 14, -1)))
            await session.add_items(user(*map(str, range(100, 120))))
            for _ in range(20):
                await session.pop_item()
            assert await session.pop_item() == user("14")[0]
            assert await session.get_items(limit=2) == user("12", "13")
            assert [await session.pop_item() for _ in range(15)] == [*user(*map(str, range(13, -1, -1))), None]
            assert await session.get_items() == [] and await session.pop_item() is None
            await session.add_items(user("after"))
            assert await session.get_items() == user("after")
        oracle.close()

    run(sidecar.unix_target, scenario)


OPS = st.one_of(
    st.tuples(st.just("add"), st.integers(1, 40)),
    st.tuples(st.just("pop"), st.integers(1, 40)),
    st.tuples(st.just("foreign"), st.integers(1, 60)),  # another writer's events in the same session
    st.tuples(st.just("clear")),
    st.tuples(st.just("get"), st.one_of(st.none(), st.integers(1, 50))),
)


def test_long_runs_of_adds_pops_and_other_events_read_as_sqlite_sessions_do(sidecar: Sidecar) -> None:
    ids, texts = itertools.count(), itertools.count()

    @settings(max_examples=60, deadline=None)
    @given(ops=st.lists(OPS, max_size=20), page=st.sampled_from([None, 1, 3]))
    def check(ops: list[tuple[Any, ...]], page: int | None) -> None:
        async def scenario(client: AsyncCheckpointClient) -> None:
            name = f"runs-{next(ids)}"
            mine, oracle = CkptSession(name, client=client), SQLiteSession("oracle")
            try:
                for op in ops:
                    if op[0] == "add":
                        added = user(*(str(next(texts)) for _ in range(op[1])))
                        await mine.add_items(added)
                        await oracle.add_items(added)
                    elif op[0] == "pop":
                        for _ in range(op[1]):
                            assert await mine.pop_item() == await oracle.pop_item()
                    elif op[0] == "foreign":
                        await client.append_events(name, [event("tool_call", b"{}")] * op[1])
                    elif op[0] == "clear":
                        await mine.clear_session()
                        await oracle.clear_session()
                    else:
                        assert await mine.get_items(op[1]) == await oracle.get_items(op[1])
                assert await mine.get_items(page) == await oracle.get_items(page)
                assert await mine.get_items() == await oracle.get_items()
            finally:
                oracle.close()

        run(sidecar.unix_target, scenario)

    check()


def test_items_retention_dropped_below_a_pop_are_gone(tmp_path: Path) -> None:
    sidecar = start_sidecar(tmp_path / "data", "--keep-last-events", "26", "--sweep-interval-seconds", "0.2")
    try:

        async def scenario(client: AsyncCheckpointClient) -> None:
            session = CkptSession("dropped", client=client)
            await session.add_items(user(*map(str, range(30))))
            for _ in range(25):
                await session.pop_item()
            deadline = asyncio.get_running_loop().time() + 30
            while len([e async for e in client.events("dropped")]) > 26:
                assert asyncio.get_running_loop().time() < deadline, "no sweep applied --keep-last-events"
                await asyncio.sleep(0.05)
            # Kept: the last item popped, then the 25 pops; the pops send the read below the sweep.
            assert await session.pop_item() is None and await session.get_items() == []
            await session.add_items(user("new"))
            assert await session.get_items() == user("new") and await session.pop_item() == user("new")[0]

        run(sidecar.unix_target, scenario)
    finally:
        assert sidecar.stop() == 0, sidecar.log()
