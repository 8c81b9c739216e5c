"""The harness workloads are reproducible, honour their sizes, and every patch
merged onto the previous state gives the step's full state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import xxhash

from ckpt.bench import trajectories
from ckpt.bench.harness import workloads
from ckpt.bench.trajectories import Step
from ckpt.codec._zstd import zstd
from ckpt.v1 import checkpoint_pb2 as pb

SMALL = ["chat", "coding", "factual"]


def corpus_dir() -> Path:
    corpus = trajectories.find_corpus()
    if corpus is None or not corpus.is_dir():
        pytest.fail(f"no trajectory corpus: set {trajectories.ENV_VAR} (default {trajectories.DEFAULT_DIR})")
    return corpus


@pytest.fixture(scope="module")
def large() -> list[list[Step]]:
    # Built once: the 20 MB state takes about a second.
    return workloads.generate("large", sessions=1, steps=2)


def assert_merges(session: list[Step]) -> None:
    """Both merge paths agree with the full states: the running concatenation of
    every patch, and the previous full state followed by one patch."""
    merged = b""
    previous = b""
    for step in session:
        expected = pb.Checkpoint.FromString(step.state)
        merged += step.patch
        assert pb.Checkpoint.FromString(merged) == expected
        assert pb.Checkpoint.FromString(previous + step.patch) == expected
        previous = step.state


def assert_lifecycle(session: list[Step]) -> None:
    states = [pb.Checkpoint.FromString(step.state) for step in session]
    assert [s.step for s in states] == list(range(1, len(session) + 1))
    assert all(s.schema_version == 1 for s in states)
    assert all(s.status == pb.STATUS_DONE for s in states[-1:])
    assert all(s.status in (pb.STATUS_RUNNING, pb.STATUS_WAITING_FOR_APPROVAL) for s in states[:-1])
    # The first patch is the whole first state.
    assert session[0].patch == session[0].state


def test_every_workload_is_registered_with_a_one_line_description_and_its_sizes() -> None:
    assert list(workloads.WORKLOADS) == ["trajectories", "chat", "coding", "factual", "large"]
    for key, info in workloads.WORKLOADS.items():
        assert info.name == key
        assert info.description and "\n" not in info.description
        assert all(n >= 1 for n in (*info.quick, *info.full))
        assert info.quick[0] <= info.full[0] and info.quick[1] <= info.full[1]
    assert workloads.WORKLOADS["large"].quick == (1, 3)


@pytest.mark.parametrize("name", SMALL)
def test_synthetic_workloads_repeat_per_seed_and_their_patches_merge_to_the_states(name: str) -> None:
    a = workloads.generate(name, sessions=3, steps=6, seed=7)
    assert a == workloads.generate(name, sessions=3, steps=6, seed=7)
    assert a != workloads.generate(name, sessions=3, steps=6, seed=8)
    assert len(a) == 3 and all(len(session) == 6 for session in a)
    assert len({session[-1].state for session in a}) == 3  # sessions differ from each other
    for session in a:
        assert_merges(session)
        assert_lifecycle(session)


@pytest.mark.parametrize("name", SMALL)  # large: in test_large_repeats_per_seed
def test_a_one_step_session_starts_and_finishes_in_that_step(name: str) -> None:
    [session] = workloads.generate(name, sessions=1, steps=1)
    assert len(session) == 1
    assert_lifecycle(session)


def test_seeded_prefix_is_stable() -> None:
    # Asking for more steps or sessions extends a run without changing what came before.
    # (Only the last step differs: it sets status DONE.)
    short = workloads.generate("chat", sessions=2, steps=4, seed=1)
    long = workloads.generate("chat", sessions=3, steps=9, seed=1)
    assert [session[:3] for session in long[:2]] == [session[:3] for session in short]


def test_chat_turns_are_short_and_alternate() -> None:
    [session] = workloads.generate("chat", sessions=1, steps=20, seed=3)
    last = pb.Checkpoint.FromString(session[-1].state)
    turns = list(last.messages)[2:]
    assert [m.role for m in turns] == [pb.ROLE_ASSISTANT, pb.ROLE_USER] * 9 + [pb.ROLE_ASSISTANT]
    assert all(30 <= len(m.content) <= 400 for m in turns)
    assert all(len(step.patch) < 2_000 for step in session[1:])
    assert len(session[-1].state) < 20_000


def test_coding_rewrites_one_file_a_step_with_kilobytes_of_tool_output() -> None:
    [session] = workloads.generate("coding", sessions=1, steps=8, seed=2)
    last = pb.Checkpoint.FromString(session[-1].state)
    tool_messages = [m for m in last.messages if m.role == pb.ROLE_TOOL]
    assert len(tool_messages) == 16
    assert all(2_048 <= len(m.content) <= 21_000 for m in tool_messages)
    files = {k: v for k, v in last.working_memory.items() if k.startswith("file:")}
    assert files and all(4_000 <= len(v) <= 31_000 for v in files.values())
    for key, content in files.items():
        assert last.artifacts[key].size_bytes == len(content.encode())
    # Every step rewrites one file entry whole, and its artifact reference.
    for step in session[1:]:
        patch = pb.Checkpoint.FromString(step.patch)
        assert len(patch.working_memory) == 1 and len(patch.artifacts) == 1
    ratio = len(session[-1].state) / len(zstd.compress(session[-1].state, level=3))
    assert 3 <= ratio <= 8


def test_factual_stays_about_10_kb() -> None:
    sessions = workloads.generate("factual", sessions=4, steps=30, seed=5)
    for session in sessions:
        assert all(6_000 <= len(step.state) <= 14_000 for step in session)
        # In place only: no growth, and the lists that only grow stay empty.
        assert abs(len(session[-1].state) - len(session[0].state)) < 2_500
        last = pb.Checkpoint.FromString(session[-1].state)
        assert not last.messages and not last.decisions and not last.step_results
        assert sum(len(step.patch) for step in session) > 2 * len(session[-1].state)


def test_large_starts_over_20_mib_and_changes_by_kilobytes(large: list[list[Step]]) -> None:
    [session] = large
    assert len(session) == 2
    assert all(len(step.state) >= 20 * 1024 * 1024 for step in session)
    assert 1_000 <= len(session[1].patch) <= 64_000
    assert_merges(session)
    assert_lifecycle(session)
    state = session[0].state
    ratio = len(state) / len(zstd.compress(state, level=3))
    assert 3 <= ratio <= 6


def test_large_repeats_per_seed(large: list[list[Step]]) -> None:
    assert workloads.generate("large", sessions=1, steps=2) == large
    [other] = workloads.generate("large", sessions=1, steps=1, seed=1)
    assert len(other) == 1 and other[0].state != large[0][0].state
    assert_lifecycle(other)


def test_trajectories_replay_opens_plan_steps_and_caches_tool_results() -> None:
    corpus = trajectories.load(corpus_dir())
    sessions = workloads.generate("trajectories", sessions=4, steps=500)
    assert sessions == workloads.generate("trajectories", sessions=4, steps=500, seed=99)  # real data: no seed
    assert [len(s) for s in sessions] == [len(t.messages) for t in corpus[:4]]
    for session, traj in zip(sessions, corpus, strict=False):
        assert_merges(session)
        assert_lifecycle(session)
        last = pb.Checkpoint.FromString(session[-1].state)
        assert last.goal == traj.id
        assert [m.content for m in last.messages] == [m.get("content") or "" for m in traj.messages]
        calls = {c.id: c for m in last.messages for c in m.tool_calls}
        replies = [m for m in last.messages if m.role == pb.ROLE_TOOL and m.tool_call_id in calls]
        assert len(last.plan) == sum(len(m.tool_calls) for m in last.messages)
        assert sum(s.status == pb.STEP_STATUS_DONE for s in last.plan.values()) == len(replies)
        for reply in replies:
            call = calls[reply.tool_call_id]
            args = json.dumps(json.loads(call.arguments_json or "{}"), sort_keys=True, separators=(",", ":"))
            key = xxhash.xxh3_128_hexdigest(f"{call.name}\0{args}".encode())
            assert last.tool_cache[key].tool == call.name
    # A corpus with tool calls must have exercised the cache.
    assert any(pb.Checkpoint.FromString(s[-1].state).tool_cache for s in sessions)


def test_trajectories_are_cut_to_the_steps_and_cycled_for_more_sessions() -> None:
    corpus = trajectories.load(corpus_dir())
    sessions = workloads.generate("trajectories", sessions=len(corpus) + 2, steps=3, trajectories_dir=corpus_dir())
    assert len(sessions) == len(corpus) + 2
    assert all(len(s) == min(3, len(t.messages)) for s, t in zip(sessions, corpus + corpus[:2], strict=True))
    again = pb.Checkpoint.FromString(sessions[len(corpus)][-1].state)
    assert again.goal == f"{corpus[0].id}#1"
    assert sessions[len(corpus)][-1].state != sessions[0][-1].state


def test_trajectories_without_a_corpus_raise_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        workloads.generate("trajectories", sessions=1, steps=1, trajectories_dir=tmp_path)


@pytest.mark.parametrize(
    ("name", "sessions", "steps", "match"),
    [
        ("nope", 1, 1, "nope"),
        ("chat", 0, 1, "sessions"),
        ("factual", 1, 0, "steps"),
        ("trajectories", -1, 5, "sessions"),
        ("large", 1, -3, "steps"),
    ],
)
def test_unknown_workloads_and_sizes_below_one_are_refused(name: str, sessions: int, steps: int, match: str) -> None:
    with pytest.raises(ValueError, match=match) as err:
        workloads.generate(name, sessions=sessions, steps=steps)
    assert name in str(err.value)
