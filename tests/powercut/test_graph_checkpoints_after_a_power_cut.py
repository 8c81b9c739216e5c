"""A power cut keeps every checkpoint the embedded LangGraph saver acknowledged: a real graph run on two
threads by a process cut at one of its writes (powercut.c), and each disk the cut may leave opened by a new
saver, which finds each acknowledged turn's checkpoint and runs the graph on from the head."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from langchain_core.runnables import RunnableConfig

from ckpt.sidecar.langgraph import CkptSaver
from tests.powercut.graph_writer import THREADS, graph, items_after
from tests.powercut.image import PowerCut
from tests.support import ROOT


def _holds(image: Path, turns: dict[str, list[tuple[str, int]]]) -> None:
    with CkptSaver.embedded(image) as saver:
        for thread, done in turns.items():
            for checkpoint_id, count in done:
                config: RunnableConfig = {
                    "configurable": {"thread_id": thread, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}
                }
                found = saver.get_tuple(config)
                assert found is not None, (image, thread, checkpoint_id)
                assert found.checkpoint["channel_values"]["items"] == items_after(count), (image, thread, count)
        app = graph(saver)
        for thread in THREADS:
            config = {"configurable": {"thread_id": thread}}
            head = app.get_state(config).values.get("items", [])
            acknowledged = turns[thread][-1][1] if turns.get(thread) else 0
            # The head is the last turn acknowledged, or one after it that reached the disk unanswered.
            assert len(head) in (2 * acknowledged, 2 * acknowledged + 1, 2 * acknowledged + 2), (image, thread)
            assert head == items_after(len(head) // 2) + head[len(head) // 2 * 2 :], (image, thread)
            app.invoke({"items": ["after the cut"]}, config, durability="sync")
            assert app.get_state(config).values["items"][-2:][0] == "after the cut"


@pytest.mark.parametrize("cut_at_step", [40, 300, 1100])
def test_every_acknowledged_checkpoint_is_on_each_disk_a_power_cut_may_leave(
    tmp_path: Path, powercut_library: Path, cut_at_step: int
) -> None:
    cut = PowerCut.make(powercut_library, tmp_path / "data", tmp_path / "shadow")
    env = {**cut.env(), "POWERCUT_AT_STEP": str(cut_at_step)}
    writer = subprocess.run(
        [sys.executable, "-m", "tests.powercut.graph_writer", str(cut.watched)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert writer.returncode == -9, writer.stderr  # cut at that write (SIGKILL), nothing else ended it
    turns: dict[str, list[tuple[str, int]]] = {}
    for line in writer.stdout.splitlines():
        done = json.loads(line)
        turns.setdefault(done["thread"], []).append((done["checkpoint_id"], done["turns"]))
    _holds(cut.rebuild(tmp_path / "flushed" / "data"), turns)
    for seed in range(3):
        _holds(cut.rebuild(tmp_path / f"more-{seed}" / "data", rng=random.Random(seed)), turns)
