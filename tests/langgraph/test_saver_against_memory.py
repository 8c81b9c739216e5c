"""The saver against LangGraph's InMemorySaver, the oracle: random histories of checkpoints (continuing the
head, branching from older ones, channels set, emptied, lists grown, cut and replaced) and pending writes
(special channels included) read back the same through get_tuple and list."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.base import WRITES_IDX_MAP, BaseCheckpointSaver, CheckpointTuple, empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.memory import InMemorySaver

from ckpt.sidecar.langgraph import CkptSaver

CHANNELS = ("a", "b", "messages")
_threads = itertools.count()

values = st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=8), st.lists(st.text(max_size=6), max_size=6))
# A step: which earlier checkpoint it continues (-1: the latest), its channel changes (None: emptied),
# and the pending writes put to it afterwards.
writes = st.lists(
    st.tuples(
        st.sampled_from(["task-1", "task-2"]),
        st.lists(st.tuples(st.sampled_from(["a", "b", *WRITES_IDX_MAP]), st.integers(0, 9)), max_size=3),
    ),
    max_size=3,
)
steps = st.lists(
    st.tuples(
        st.one_of(st.just(-1), st.integers(0, 30)),
        st.dictionaries(st.sampled_from(CHANNELS), st.one_of(st.none(), values), max_size=3),
        st.booleans(),
        writes,
    ),
    min_size=1,
    max_size=12,
)


@pytest.fixture(scope="module")
def saver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CkptSaver]:
    with CkptSaver.embedded(tmp_path_factory.mktemp("lg") / "data") as s:
        yield s


def grown(value: Any, extend: bool, previous: Any) -> Any:
    # Lists often extend the previous value, as a conversation does.
    if extend and isinstance(value, list) and isinstance(previous, list):
        return previous + value
    return value


def replay(
    savers: list[BaseCheckpointSaver[Any]],
    thread_id: str,
    history: list[Any],
    after_step: Callable[[], None] = lambda: None,
) -> None:
    """``history``'s steps put to each saver, ``after_step`` called after each step's put and writes."""
    configs: list[Any] = []
    states: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for i, (parent_index, changes, extend, step_writes) in enumerate(history):
        if configs and parent_index != -1:
            parent_index %= len(configs)
        parent = (configs[parent_index] if parent_index != -1 else configs[-1]) if configs else None
        base_values, base_versions = states[configs.index(parent)] if parent else ({}, {})
        channel_values, channel_versions = dict(base_values), dict(base_versions)
        new_versions: Any = {}
        for channel, value in changes.items():
            new_versions[channel] = channel_versions[channel] = i + 1
            if value is None:
                channel_values.pop(channel, None)
            else:
                channel_values[channel] = grown(value, extend, channel_values.get(channel))
        checkpoint: Any = empty_checkpoint()
        checkpoint.update(id=str(uuid6(clock_seq=-1)), channel_values=channel_values, channel_versions=channel_versions)
        config: Any = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        if parent:
            config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
        metadata: Any = {"source": "loop", "step": i, "parents": {}, "run_id": f"run-{i % 3}"}
        stored = [s.put(config, checkpoint, metadata, new_versions) for s in savers]
        configs.append(stored[0])
        states.append((channel_values, channel_versions))
        for task_id, task_writes in step_writes:
            for s, c in zip(savers, stored, strict=True):
                s.put_writes(c, task_writes, task_id, task_path=f"path-{task_id}")
        after_step()


def comparable(t: CheckpointTuple | None) -> Any:
    if t is None:
        return None
    checkpoint = {k: t.checkpoint[k] for k in ("id", "channel_values", "channel_versions", "versions_seen")}
    parent = t.parent_config["configurable"]["checkpoint_id"] if t.parent_config else None
    return (t.config["configurable"], checkpoint, t.metadata, parent, t.pending_writes)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=steps)
def test_every_read_matches_in_memory_saver(saver: CkptSaver, history: list[Any]) -> None:
    oracle = InMemorySaver()
    thread_id = f"thread-{next(_threads)}"
    replay([saver, oracle], thread_id, history)
    config: Any = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    listed = [comparable(t) for t in saver.list(config)]
    assert listed == [comparable(t) for t in oracle.list(config)]
    assert comparable(saver.get_tuple(config)) == comparable(oracle.get_tuple(config))
    for t in oracle.list(config):
        assert comparable(saver.get_tuple(t.config)) == comparable(t)
    limited = {"run_id": "run-1"}
    assert [comparable(t) for t in saver.list(config, filter=limited, limit=2)] == [
        comparable(t) for t in oracle.list(config, filter=limited, limit=2)
    ]
    for t in list(oracle.list(config))[1::3]:  # listings that resume before a checkpoint, as a history view pages
        assert [comparable(x) for x in saver.list(config, before=t.config, limit=3)] == [
            comparable(x) for x in oracle.list(config, before=t.config, limit=3)
        ]


def test_a_namespaces_latest_checkpoint_is_whole_after_a_rewrite(tmp_path: Path) -> None:
    """Cut-off list elements past the allowance make the next step a whole rewrite; reads are unchanged."""
    with CkptSaver.embedded(tmp_path / "data") as saver:
        oracle = InMemorySaver()
        history: list[Any] = [(-1, {"messages": [f"m{i}" for i in range(300)]}, False, [])]
        history += [(-1, {"messages": [f"n{i}"] * (i % 7)}, False, []) for i in range(100)]
        replay([saver, oracle], "rewritten", history)
        config: Any = {"configurable": {"thread_id": "rewritten", "checkpoint_ns": ""}}
        assert [comparable(t) for t in saver.list(config)] == [comparable(t) for t in oracle.list(config)]
