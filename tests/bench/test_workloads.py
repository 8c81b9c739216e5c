"""The benchmark workloads replay correctly: each step's patch merged onto the
previous states gives the step's full state (on data generated here, not the
shared corpus)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpt.bench import synthetic, trajectories
from ckpt.v1 import checkpoint_pb2 as pb


def write_corpus(directory: Path) -> None:
    record = {
        "id": "test/one",
        "source": "generated",
        "license": "MIT",
        "messages": [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": "Fix the bug ✓"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}],
            },
            {"role": "tool", "content": "a.py\nb.py", "tool_call_id": "c1"},
        ],
    }
    (directory / "gen.jsonl").write_text(json.dumps(record) + "\n\n")


def assert_patches_merge_to_states(steps: list[trajectories.Step]) -> None:
    merged = b""
    for step in steps:
        merged += step.patch
        assert pb.Checkpoint.FromString(merged) == pb.Checkpoint.FromString(step.state)


def test_trajectory_replay_appends_one_message_a_step(tmp_path: Path) -> None:
    write_corpus(tmp_path)
    [traj] = trajectories.load(tmp_path)
    steps = list(trajectories.replay(traj))
    assert len(steps) == 4
    last = pb.Checkpoint.FromString(steps[-1].state)
    assert last.step == 4 and last.current_step_id == "step-4"
    assert [m.role for m in last.messages] == [pb.ROLE_SYSTEM, pb.ROLE_USER, pb.ROLE_ASSISTANT, pb.ROLE_TOOL]
    assert last.messages[2].tool_calls[0].name == "ls" and last.messages[3].tool_call_id == "c1"
    assert_patches_merge_to_states(steps)


def test_the_corpus_is_an_explicit_path_else_the_environment_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_corpus(tmp_path)
    monkeypatch.setenv(trajectories.ENV_VAR, str(tmp_path))
    assert trajectories.find_corpus() == tmp_path
    assert trajectories.find_corpus(tmp_path / "x") == tmp_path / "x"  # an explicit path wins
    with pytest.raises(FileNotFoundError, match=r"no \*\.jsonl files"):
        trajectories.load(tmp_path / "x")


def test_synthetic_sessions_are_reproducible_and_edit_in_place() -> None:
    a, b = synthetic.session(seed=3, steps=20), synthetic.session(seed=3, steps=20)
    steps = list(a)
    assert [s.state for s in steps] == [s.state for s in b]
    assert_patches_merge_to_states(steps)
    # in-place edits: concatenated patches outgrow the canonical state
    assert sum(len(s.patch) for s in steps) > 1.2 * len(steps[-1].state)


def test_a_missing_corpus_is_explained_with_how_to_point_at_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(trajectories.ENV_VAR, raising=False)
    # The default sits beside the checkout; pointed elsewhere so that the test does not depend on it.
    monkeypatch.setattr(trajectories, "DEFAULT_DIR", tmp_path / "absent")
    problem = trajectories.corpus_problem()
    assert problem is not None and problem.startswith("no trajectory corpus")
    assert "point --trajectories DIR or $CKPT_TRAJECTORIES at a folder of *.jsonl trajectories" in problem
    with pytest.raises(FileNotFoundError) as raised:
        trajectories.load()
    assert str(raised.value) == problem
    write_corpus(tmp_path)
    assert trajectories.corpus_problem(tmp_path) is None
    assert [t.id for t in trajectories.load(tmp_path)] == ["test/one"]
