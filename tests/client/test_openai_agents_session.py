"""CkptSession, the OpenAI Agents SDK session in ckpt's event log, against a real sidecar: the cases the SDK
tests its own SQLiteSession with (order, limits, pop, clear, sessions apart, settings, items that do not
decode), random histories checked against SQLiteSession itself, Runner turns, and agent and sidecar
processes killed between turns."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from agents import Runner, SessionSettings, SQLiteSession, TResponseInputItem, set_tracing_disabled
from agents.memory import Session
from agents.testing import ScriptedModel, assistant_message
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt.sidecar.client import AsyncCheckpointClient, event
from ckpt.sidecar.openai_agents import CLEAR, ITEM, POP, CkptSession
from ckpt.v1 import service_pb2
from tests.client.openai_agents_agent import ANSWER, NOTES, QUESTION, RUN_CONFIG, first_turn, note, scripted_agent
from tests.support import ROOT, Sidecar, start_sidecar

Scenario = Callable[[AsyncCheckpointClient], Awaitable[None]]


def run(target: str, scenario: Scenario) -> None:
    """``scenario(client)`` in an event loop of its own, with a client to ``target``."""

    async def main() -> None:
        async with AsyncCheckpointClient(target) as client:
            await scenario(client)

    asyncio.run(main())


def messages(*contents: str) -> list[TResponseInputItem]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": c} for i, c in enumerate(contents)]


def contents(items: Sequence[Any]) -> list[Any]:
    return [item.get("content") for item in items]


def test_items_come_back_in_order_and_a_limit_gives_the_latest(sidecar: Sidecar) -> None:
    async def scenario(client: AsyncCheckpointClient) -> None:
        session = CkptSession("count", client=client)
        assert await session.get_items() == [] and await session.get_items(limit=3) == []  # no ckpt session yet
        six = messages("Message 1", "Response 1", "Message 2", "Response 2", "Message 3", "Response 3")
        await session.add_items(six[:1])
        await session.add_items(six[1:])
        await session.add_items([])  # nothing appended
        assert await session.get_items() == six
        assert contents(await session.get_items(limit=2)) == ["Message 3", "Response 3"]
        assert contents(await session.get_items(limit=4)) == ["Message 2", "Response 2", "Message 3", "Response 3"]
        assert await session.get_items(limit=10) == six
        assert await session.get_items(limit=0) == []
        assert await session.get_items(limit=-1) == six  # SQLite's negative LIMIT: no limit
        log = [e async for e in client.events("count")]
        assert [e.type for e in log] == [ITEM] * 6 and log[0].payload == b'{"role":"user","content":"Message 1"}'

    run(sidecar.unix_target, scenario)


def test_text_of_any_kind_round_trips(sidecar: Sidecar) -> None:
    async def scenario(client: AsyncCheckpointClient) -> None:
        session = CkptSession("text", client=client)
        tricky = messages(
            "こんにちは",
            "😊👍",
            "Привет",
            "O'Reilly",
            "Robert'); DROP TABLE students;--",
            '"quoted" \\ back\nslash',
            "lone \ud800 surrogate",  # not UTF-8: stored escaped, read back the same
            "",
        )
        await session.add_items(tricky)
        assert await session.get_items() == tricky

    run(sidecar.unix_target, scenario)


def test_sdk_items_round_trip(sidecar: Sidecar) -> None:
    """Items of every shape a turn leaves: messages with content parts, tool calls and their outputs,
    reasoning, numbers and nulls."""
    items: list[Any] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Need a tool."}]},
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city":"Paris"}', "id": "fc_1"},
        {"type": "function_call_output", "call_id": "c1", "output": '{"temp_c": 21.5, "rain": null}'},
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "21.5 °C", "annotations": [], "logprobs": []}],
        },
        {"type": "custom", "n": [1, 2.5, -3, True, None, {"deep": {"er": []}}]},
    ]

    async def scenario(client: AsyncCheckpointClient) -> None:
        session = CkptSession("shapes", client=client)
        await session.add_items(items)
        assert await session.get_items() == items
        assert await session.pop_item() == items[-1]

    run(sidecar.unix_target, scenario)


def test_pop_removes_and_returns_the_newest_then_none(sidecar: Sidecar) -> None:
    async def scenario(client: AsyncCheckpointClient) -> None:
        session = CkptSession("pop", client=client)
        assert await session.pop_item() is None  # on a session that does not exist
        await session.add_items(messages("Hello", "Hi there!", "How are you?"))
        assert await session.pop_item() == {"role": "user", "content": "How are you?"}
        assert contents(await session.get_items()) == ["Hello", "Hi there!"]
        assert await session.pop_item() == {"role": "assistant", "content": "Hi there!"}
        await session.add_items(messages("Again"))
        assert contents(await session.get_items()) == ["Hello", "Again"]
        assert contents(await session.get_items(limit=1)) == ["Again"]
        assert contents([await session.pop_item(), await session.pop_item()]) == ["Again", "Hello"]
        assert await session.pop_item() is None
        assert await session.get_items() == []
        # A pop names the seq it removes; nothing is deleted from the log.
        log = [(e.type, e.payload) async for e in client.events("pop")]
        assert [t for t, _ in log] == [ITEM, ITEM, ITEM, POP, POP, ITEM, POP, POP]
        assert [p for t, p in log if t == POP] == [b'{"seq":3}', b'{"seq":2}', b'{"seq":6}', b'{"seq":1}']

    run(sidecar.unix_target, scenario)


def test_clear_empties_the_session_and_later_items_follow_it(sidecar: Sidecar) -> None:
    async def scenario(client: AsyncCheckpointClient) -> None:
        session = CkptSession("clear", client=client)
        await session.clear_session()  # nothing to clear: still fine
        await session.add_items(messages("a", "b", "c"))
        await session.pop_item()
        await session.clear_session()
        assert await session.get_items() == [] and await session.pop_item() is None
        await session.add_items(messages("d", "e"))
        assert contents(await session.get_items()) == ["d", "e"]
        assert contents(await session.get_items(limit=5)) == ["d", "e"]
        await session.clear_session()
        assert await session.get_items(limit=1) == []
        kinds = [e.type async for e in client.events("clear")]
        assert kinds == [CLEAR, ITEM, ITEM, ITEM, POP, CLEAR, ITEM, ITEM, CLEAR]

    run(sidecar.unix_target, scenario)


def test_two_sessions_stay_apart(sidecar: Sidecar) -> None:
    async def scenario(client: AsyncCheckpointClient) -> None:
        one, two = CkptSession("session_1", client=client), CkptSession("session_2", client=client)
        await one.add_items(messages("one: hello"))
        await two.add_items(messages("two: a", "two: b"))
        assert contents([await two.pop_item()]) == ["two: b"]
        assert contents(await one.get_items()) == ["one: hello"]
        assert contents(await two.get_items()) == ["two: a"]
        await one.clear_session()
        assert contents(await two.get_items()) == ["two: a"]

    run(sidecar.unix_target, scenario)


def test_settings_default_and_limit_as_the_sdk_has_them(sidecar: Sidecar) -> None:
    async def scenario(client: AsyncCheckpointClient) -> None:
        plain = CkptSession("settings", client=client)
        typed: Session = plain  # the SDK's protocol, checked by mypy
        assert isinstance(typed, Session)  # and at run time
        assert isinstance(plain.session_settings, SessionSettings) and plain.session_settings.limit is None
        limited = CkptSession("settings", client=client, session_settings=SessionSettings(limit=3))
        await limited.add_items([{"role": "user", "content": f"Message {i}"} for i in range(10)])
        assert contents(await limited.get_items()) == ["Message 7", "Message 8", "Message 9"]
        assert contents(await limited.get_items(limit=2)) == ["Message 8", "Message 9"]  # explicit wins
        assert len(await plain.get_items()) == 10
        from_dict = CkptSession("settings", client=client, session_settings={"limit": 0})
        assert isinstance(from_dict.session_settings, SessionSettings) and await from_dict.get_items() == []
        with pytest.raises(TypeError, match="Unknown session settings: limitt"):
            CkptSession("settings", client=client, session_settings={"limitt": 1})
        with pytest.raises(TypeError, match="client must be an AsyncCheckpointClient"):
            CkptSession("settings", client=object())  # type: ignore[arg-type]

    run(sidecar.unix_target, scenario)


def test_items_that_do_not_decode_are_skipped_and_popped_past(sidecar: Sidecar) -> None:
    """As SQLiteSession treats rows that are not JSON: another writer's events of the item type."""

    async def scenario(client: AsyncCheckpointClient) -> None:
        session = CkptSession("corrupt", client=client)
        await session.add_items(messages("valid 0", "valid 1", "valid 2"))
        await client.append_events("corrupt", [event(ITEM, b"not valid json {{{"), event(ITEM, b"\xff\xfe")])
        await client.append_events("corrupt", [event(POP, b"nonsense"), event("tool_call", b"{}")])  # ignored
        assert contents(await session.get_items(limit=2)) == ["valid 1", "valid 2"]  # counts decodable items
        assert await session.pop_item() == {"role": "user", "content": "valid 2"}
        assert contents(await session.get_items()) == ["valid 0", "valid 1"]
        pops = [e.payload async for e in client.events("corrupt", types=(POP,))]
        assert pops == [b"nonsense", b'{"seq":3}']  # one marker drops the item it names and all above it

    run(sidecar.unix_target, scenario)


def test_an_agents_own_events_and_checkpoints_share_the_session(sidecar: Sidecar) -> None:
    async def scenario(client: AsyncCheckpointClient) -> None:
        session = CkptSession("agent-7", client=client)
        await client.append_events("agent-7", [event("tool_call", b"{}")], put=service_pb2.PutRequest(state=b"s"))
        await session.add_items(messages("hi"))
        await client.append_events("agent-7", [event("decision", b"x")] * 3)
        assert contents(await session.get_items(limit=1)) == ["hi"]
        assert contents([await session.pop_item()]) == ["hi"]
        assert (await client.get("agent-7")).state == b"s"
        assert [e.type async for e in client.events("agent-7", newest_first=True)][:2] == [POP, "decision"]

    run(sidecar.unix_target, scenario)


def test_more_items_than_one_append_or_page_holds(sidecar: Sidecar) -> None:
    async def scenario(client: AsyncCheckpointClient) -> None:
        session = CkptSession("long", client=client)
        items: list[Any] = [{"role": "user", "content": str(i)} for i in range(2500)]
        await session.add_items(items)  # three appends of at most 1000
        assert await session.get_items() == items
        assert await session.get_items(limit=1500) == items[1000:]  # two pages, newest first
        assert (await client.append_events("long", [event("x")])).first_seq == 2501  # one item, one event

    run(sidecar.unix_target, scenario)


def test_a_change_the_caller_cancels_is_still_made(sidecar: Sidecar) -> None:
    async def scenario(client: AsyncCheckpointClient) -> None:
        session = CkptSession("cancelled", client=client)
        adding = asyncio.create_task(session.add_items(messages("kept")))
        await asyncio.sleep(0)  # started: the append is under way
        adding.cancel()
        with pytest.raises(asyncio.CancelledError):
            await adding
        assert contents(await session.get_items()) == ["kept"]
        popping = asyncio.create_task(session.pop_item())
        await asyncio.sleep(0)
        popping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await popping
        assert await session.get_items() == []

    run(sidecar.unix_target, scenario)


def test_connect_owns_its_client_and_a_closed_session_refuses_calls(sidecar: Sidecar) -> None:
    async def scenario(client: AsyncCheckpointClient) -> None:
        async with CkptSession.connect("owned", sidecar.unix_target, timeout_seconds=10) as owned:
            await owned.add_items(messages("one"))
        with pytest.raises(RuntimeError, match="CkptSession is closed"):
            await owned.add_items([])  # the empty fast path is not a way around it
        with pytest.raises(RuntimeError, match="CkptSession is closed"):
            await owned.get_items()
        borrowed = CkptSession("owned", client=client)
        await borrowed.close()
        with pytest.raises(RuntimeError, match="CkptSession is closed"):
            await borrowed.pop_item()
        assert contents(await CkptSession("owned", client=client).get_items()) == ["one"]  # client still open

    run(sidecar.unix_target, scenario)
    os.environ["CKPT_TARGET"] = sidecar.unix_target
    try:

        async def from_env() -> list[TResponseInputItem]:
            async with CkptSession.connect("owned") as session:
                return await session.get_items()

        assert contents(asyncio.run(from_env())) == ["one"]
    finally:
        del os.environ["CKPT_TARGET"]


class PopFirst(AsyncCheckpointClient):
    """A client that, before its first pop marker goes out, lets another session pop: two processes'
    pops racing for the same newest item, which a real sidecar cannot be made to interleave on demand."""

    rival: CkptSession | None = None
    rival_popped: Any = None

    async def append_events(self, session_id: str, events: Any, **options: Any) -> Any:
        if self.rival is not None and next(iter(events)).type == POP:
            rival, self.rival = self.rival, None
            self.rival_popped = await rival.pop_item()
        return await super().append_events(session_id, events, **options)


def test_pops_racing_for_one_item_return_it_once(sidecar: Sidecar) -> None:
    async def scenario(client: AsyncCheckpointClient) -> None:
        racing = PopFirst(sidecar.unix_target, own_connection=True)
        async with racing:
            mine, theirs = CkptSession("race", client=racing), CkptSession("race", client=client)
            await mine.add_items(messages("first", "second", "third"))
            racing.rival = theirs
            assert contents([await mine.pop_item()]) == ["second"]  # after theirs took the third
            assert contents([racing.rival_popped]) == ["third"]
            assert contents(await theirs.get_items()) == ["first"]
            # Many pops from two clients at once: each item comes out once.
            await mine.add_items(messages(*map(str, range(40))))
            popped: list[Any] = await asyncio.gather(*(s.pop_item() for s in [mine, theirs] * 25))
            taken = [p["content"] for p in popped if p is not None]
            assert sorted(taken) == sorted(["first", *map(str, range(40))])  # 41 items, 50 pops
            assert await mine.get_items() == []

    run(sidecar.unix_target, scenario)


# -- random histories against the SDK's own SQLiteSession --------------------------------------------

OPS = st.one_of(
    st.tuples(st.just("add"), st.lists(st.text(st.characters(exclude_categories=()), max_size=6), max_size=4)),
    st.tuples(st.just("pop")),
    st.tuples(st.just("clear")),
    st.tuples(st.just("get"), st.one_of(st.none(), st.integers(-2, 8))),
)


def test_random_histories_read_as_sqlite_sessions_do(sidecar: Sidecar) -> None:
    ids = itertools.count()

    @settings(max_examples=40)
    @given(ops=st.lists(OPS, max_size=25), limit=st.one_of(st.none(), st.integers(0, 4)))
    def check(ops: list[tuple[Any, ...]], limit: int | None) -> None:
        async def scenario(client: AsyncCheckpointClient) -> None:
            configured = SessionSettings(limit=limit)
            mine = CkptSession(f"random-{next(ids)}", client=client, session_settings=configured)
            oracle = SQLiteSession("oracle", session_settings=configured)
            try:
                for op in ops:
                    if op[0] == "add":
                        added = [{"role": "user", "content": text} for text in op[1]]
                        await mine.add_items(added)  # type: ignore[arg-type]
                        await oracle.add_items(added)  # type: ignore[arg-type]
                    elif op[0] == "pop":
                        assert await mine.pop_item() == await oracle.pop_item()
                    elif op[0] == "clear":
                        await mine.clear_session()
                        await oracle.clear_session()
                    else:
                        assert await mine.get_items(op[1]) == await oracle.get_items(op[1])
                assert await mine.get_items(limit=-1) == await oracle.get_items(limit=-1)
            finally:
                oracle.close()

        run(sidecar.unix_target, scenario)

    check()


# -- agents.Runner turns -----------------------------------------------------------------------------


def test_a_runner_turn_sees_the_turns_before_it(sidecar: Sidecar) -> None:
    async def scenario(client: AsyncCheckpointClient) -> None:
        session = CkptSession("runner", client=client)
        await first_turn(session)
        agent, model = scripted_agent()
        model.enqueue([assistant_message("California")])
        result = await Runner.run(agent, "Which state is that in?", session=session, run_config=RUN_CONFIG)
        assert result.final_output == "California"
        sent = model.calls[-1].input
        assert [item.get("type", "message") for item in sent] == [
            "message",
            "function_call",
            "function_call_output",
            "message",
            "message",
        ]
        assert sent[0]["content"] == QUESTION and sent[2]["output"] == "Golden Gate Bridge: San Francisco"
        assert sent[3]["content"][0]["text"] == ANSWER and sent[4]["content"] == "Which state is that in?"
        stored: list[Any] = await session.get_items()
        assert stored[:5] == sent and stored[5]["content"][0]["text"] == "California"

    run(sidecar.unix_target, scenario)


# run_sync ends each run with the loop's shutdown_asyncgens() and keeps the loop for the next, on which
# every async generator then started (the client's events() pages) draws this warning; they are closed
# explicitly all the same, which is what the loop's finalizer would have done.
@pytest.mark.filterwarnings("ignore:asynchronous generator .* after loop.shutdown_asyncgens:ResourceWarning")
def test_run_sync_uses_a_connected_session(sidecar: Sidecar) -> None:
    """connect() makes its client in the loop of its first call: Runner.run_sync's own."""
    session = CkptSession.connect("sync", sidecar.unix_target)
    agent, model = scripted_agent()
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        for answer in ["one", "two"]:
            model.enqueue([assistant_message(answer)])
            result = Runner.run_sync(agent, f"say {answer}", session=session, run_config=RUN_CONFIG)
            assert result.final_output == answer
        assert len(model.calls[-1].input) == 3  # the first turn's question and answer, then the new question
        loop.run_until_complete(session.close())
    finally:
        asyncio.set_event_loop(None)
        loop.close()


# -- processes killed between turns ------------------------------------------------------------------


def test_an_agent_killed_between_turns_is_continued_by_a_new_process(tmp_path: Path) -> None:
    """An agent process runs a turn and adds notes until SIGKILL; the sidecar is SIGKILLed and restarted
    too. A new process reads every acknowledged item back (each add whole or not at all) and runs the next
    turn on that history."""
    data, socket_path = tmp_path / "data", tmp_path / "ckpt.sock"
    sidecar = start_sidecar(data, socket_path=socket_path)
    env = {**os.environ, "OPENAI_AGENTS_DISABLE_TRACING": "1"}
    agent_process = subprocess.Popen(
        [sys.executable, "-m", "tests.client.openai_agents_agent", sidecar.unix_target, "crash"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
    )
    assert agent_process.stdout is not None
    try:
        assert agent_process.stdout.readline() == b"turn\n"
        acknowledged = -1
        while acknowledged < 3:  # a few notes in, and a next one most likely under way
            acknowledged = int(agent_process.stdout.readline())
        agent_process.kill()
        assert agent_process.wait(30) == -signal.SIGKILL
    finally:
        agent_process.kill()
        agent_process.wait(30)
        agent_process.stdout.close()
    assert sidecar.stop(signal.SIGKILL) == -signal.SIGKILL
    sidecar = start_sidecar(data, socket_path=socket_path)
    try:

        async def scenario(client: AsyncCheckpointClient) -> None:
            session = CkptSession("crash", client=client)
            items: list[Any] = await session.get_items()
            turn, notes = items[:4], items[4:]
            assert turn[0]["content"] == QUESTION and turn[3]["content"][0]["text"] == ANSWER
            assert len(notes) % NOTES == 0 and len(notes) // NOTES > acknowledged  # whole notes, none lost
            assert notes == [item for n in range(len(notes) // NOTES) for item in note(n)]
            agent, model = scripted_agent()
            model.enqueue([assistant_message("California")])
            result = await Runner.run(agent, "Which state?", session=session, run_config=RUN_CONFIG)
            assert result.final_output == "California"
            assert model.calls[-1].input == [*items, {"content": "Which state?", "role": "user"}]

        run(sidecar.unix_target, scenario)
    finally:
        assert sidecar.stop() == 0, sidecar.log()


# -- retention ------------------------------------------------------------------------------------


def test_keep_last_events_bounds_the_history_from_its_oldest_end(tmp_path: Path) -> None:
    sidecar = start_sidecar(tmp_path / "data", "--keep-last-events", "4", "--sweep-interval-seconds", "0.2")
    try:

        async def scenario(client: AsyncCheckpointClient) -> None:
            session = CkptSession("bounded", client=client)
            await session.add_items(messages("a", "b", "c", "d", "e"))
            await session.pop_item()  # the marker is one of the four kept
            deadline = asyncio.get_running_loop().time() + 30
            while len([e async for e in client.events("bounded")]) > 4:
                assert asyncio.get_running_loop().time() < deadline, "no sweep applied --keep-last-events"
                await asyncio.sleep(0.05)
            assert contents(await session.get_items()) == ["c", "d"]

        run(sidecar.unix_target, scenario)
    finally:
        assert sidecar.stop() == 0, sidecar.log()


# -- the example in docs/clients.md -------------------------------------------------------------------


def test_the_documented_example_runs(sidecar: Sidecar, capsys: pytest.CaptureFixture[str]) -> None:
    """As written, but for the sidecar's address and a scripted model in place of OpenAI's."""
    page = (ROOT / "docs" / "clients.md").read_text().split("### OpenAI Agents SDK sessions\n", 1)[1]
    found = re.search(r"```python\n(.*?)```", page, re.DOTALL)
    assert found, "no python block under OpenAI Agents SDK sessions"
    agent = 'Agent(name="Assistant", instructions="Reply very concisely.")'
    source = found.group(1).replace('"unix:data/ckpt.sock"', repr(sidecar.unix_target))
    assert agent in source
    source = source.replace(agent, agent[:-1] + ", model=model)")
    model = ScriptedModel([[assistant_message("San Francisco")], [assistant_message("California")]])
    set_tracing_disabled(True)  # nowhere to send traces; the default (enabled, no env variable) after
    try:
        exec(compile(source, "docs/clients.md", "exec"), {"model": model})
    finally:
        set_tracing_disabled(False)
    assert capsys.readouterr().out == "San Francisco\nCalifornia\n4\n"
    assert len(model.calls[-1].input) == 3  # the second turn was sent the first
