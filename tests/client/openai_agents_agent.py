"""An agent for the OpenAI Agents SDK session tests: a scripted model and a tool, and, run as a program
(``python -m tests.client.openai_agents_agent TARGET SESSION``), an agent process for the crash test.

The program runs one turn through ``agents.Runner`` with a CkptSession, prints ``turn``, then adds notes
of ``NOTES`` items each, printing each note's number once its add_items returned, until it is killed.
"""

from __future__ import annotations

import asyncio
import sys
from itertools import count
from typing import Any

from agents import Agent, RunConfig, Runner, TResponseInputItem, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call

from ckpt.sidecar.openai_agents import CkptSession

QUESTION = "Where is the Golden Gate Bridge?"
ANSWER = "San Francisco"
#: Items per note: one add_items each, so all of a note is stored or none of it.
NOTES = 50
#: No traces sent anywhere: the tests have no network and no API key.
RUN_CONFIG = RunConfig(tracing_disabled=True)


@function_tool
def locate(place: str) -> str:
    """Which city a place is in."""
    return f"{place}: San Francisco"


def scripted_agent() -> tuple[Agent[Any], ScriptedModel]:
    """An agent whose model answers from a script (``model.enqueue``) and records what it was sent."""
    model = ScriptedModel()
    return Agent(name="guide", model=model, tools=[locate]), model


async def first_turn(session: CkptSession) -> None:
    """The model calls the tool, then answers from its output."""
    agent, model = scripted_agent()
    model.enqueue([function_call("locate", {"place": "Golden Gate Bridge"}, call_id="call-1")])
    model.enqueue([assistant_message(ANSWER)])
    result = await Runner.run(agent, QUESTION, session=session, run_config=RUN_CONFIG)
    assert result.final_output == ANSWER


def note(number: int) -> list[TResponseInputItem]:
    return [{"role": "user", "content": f"note {number}.{i}"} for i in range(NOTES)]


async def main(target: str, session_id: str) -> None:
    async with CkptSession.connect(session_id, target) as session:
        await first_turn(session)
        print("turn", flush=True)
        for number in count():
            await session.add_items(note(number))
            print(number, flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
