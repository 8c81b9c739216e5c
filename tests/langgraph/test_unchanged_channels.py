"""A put that continues the head serializes only the channels LangGraph says changed (``new_versions``):
a large channel set once and left alone costs its serialization once, not at every step. Reads stay
those of InMemorySaver, including after a step written whole (a rewrite) and a branch, and after the
store is reopened."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from ckpt.sidecar.langgraph import CkptSaver

from .test_saver_against_memory import comparable, replay

DOCUMENTS = [f"document {i}: " + "lorem ipsum " * 40 for i in range(50)]
CONFIG: Any = {"configurable": {"thread_id": "docs", "checkpoint_ns": ""}}


class RecordingSerializer(JsonPlusSerializer):
    """LangGraph's serializer, keeping every object it was asked to serialize."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Any] = []

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        self.seen.append(obj)
        return super().dumps_typed(obj)


def _documents_serialized(serde: RecordingSerializer) -> int:
    wanted = set(DOCUMENTS)
    return sum(1 for obj in serde.seen if isinstance(obj, str) and obj in wanted)


def _same_reads(saver: CkptSaver, oracle: InMemorySaver) -> None:
    assert [comparable(t) for t in saver.list(CONFIG)] == [comparable(t) for t in oracle.list(CONFIG)]
    for t in oracle.list(CONFIG):
        assert comparable(saver.get_tuple(t.config)) == comparable(t)


def test_steps_that_leave_a_channel_alone_do_not_serialize_it(tmp_path: Path) -> None:
    serde = RecordingSerializer()
    oracle = InMemorySaver()
    history: list[Any] = [(-1, {"documents": DOCUMENTS, "messages": ["hello"]}, False, [])]
    history += [(-1, {"messages": [f"turn {i}"]}, True, [("task", [("messages", i)])]) for i in range(30)]
    per_step: list[int] = []

    def counted() -> None:
        per_step.append(_documents_serialized(serde))
        serde.seen.clear()

    with CkptSaver.embedded(tmp_path / "data", serde=serde) as saver:
        replay([saver, oracle], "docs", history, after_step=counted)
        assert per_step == [len(DOCUMENTS)] + [0] * (len(history) - 1)
        _same_reads(saver, oracle)
    with CkptSaver.embedded(tmp_path / "data") as reopened:
        _same_reads(reopened, oracle)


def test_a_step_written_whole_or_on_a_branch_still_holds_the_unchanged_channel(tmp_path: Path) -> None:
    """Cut-off list elements past the allowance make a step continuing the head a whole rewrite; a step
    from an older checkpoint starts a branch, also written whole. Both hold the channel they did not
    change."""
    oracle = InMemorySaver()
    history: list[Any] = [(-1, {"documents": DOCUMENTS, "messages": [f"m{i}" for i in range(300)]}, False, [])]
    history += [(-1, {"messages": [f"n{i}"] * (i % 5)}, False, []) for i in range(40)]
    history += [(3, {"messages": ["branched"]}, False, []), (-1, {"messages": ["after"]}, True, [])]
    with CkptSaver.embedded(tmp_path / "data") as saver:
        replay([saver, oracle], "docs", history)
        _same_reads(saver, oracle)
    with CkptSaver.embedded(tmp_path / "data") as reopened:
        _same_reads(reopened, oracle)
        head = reopened.get_tuple(CONFIG)
        assert head is not None and head.checkpoint["channel_values"]["documents"] == DOCUMENTS
