"""Replay real agent trajectories as sequences of checkpoint writes.

The corpus lives outside the repository (``../shared/data/trajectories/``; see
its SOURCES.md). Its location is taken from, in order: an explicit path, the
``CKPT_TRAJECTORIES`` environment variable, or that default folder when it
exists. Nothing from it is copied into the repository.

Each trajectory becomes one session. Step *i* appends the *i*-th message and
moves the current step, exactly as an agent loop checkpointing after every
message would. Every step yields both write forms of the same change:

- ``state``: the whole new ``ckpt.v1.Checkpoint`` (what a REPLACE write sends);
- ``patch``: only the changed fields (what a MERGE write sends), such that
  parsing ``previous_merged_state + patch`` gives the same message as ``state``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt.v1 import checkpoint_pb2

ENV_VAR = "CKPT_TRAJECTORIES"
DEFAULT_DIR = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "trajectories"

_ROLES = {
    "system": checkpoint_pb2.ROLE_SYSTEM,
    "user": checkpoint_pb2.ROLE_USER,
    "assistant": checkpoint_pb2.ROLE_ASSISTANT,
    "tool": checkpoint_pb2.ROLE_TOOL,
}


@dataclass(frozen=True, slots=True)
class Step:
    """One checkpoint write: the full state and the equivalent merge patch."""

    state: bytes
    patch: bytes


@dataclass(frozen=True, slots=True)
class Trajectory:
    id: str
    source: str
    messages: list[dict[str, Any]]


def find_corpus(path: str | os.PathLike[str] | None = None) -> Path | None:
    """Return the corpus directory, or None when none is configured or present."""
    if path is not None:
        return Path(path)
    if env := os.environ.get(ENV_VAR):
        return Path(env)
    return DEFAULT_DIR if DEFAULT_DIR.is_dir() else None


def corpus_problem(path: str | os.PathLike[str] | None = None) -> str | None:
    """Why no trajectory can be loaded, and how to point at a corpus, in one line; None when there are some."""
    corpus = find_corpus(path)
    if corpus is None:
        found = f"no trajectory corpus (${ENV_VAR} is not set and the default {DEFAULT_DIR} does not exist)"
    elif not any(corpus.glob("*.jsonl")):
        found = f"no *.jsonl files in trajectory corpus {corpus}"
    else:
        return None
    return f"{found}; point --trajectories DIR or ${ENV_VAR} at a folder of *.jsonl trajectories"


def load(path: str | os.PathLike[str] | None = None) -> list[Trajectory]:
    """Load every trajectory of every ``*.jsonl`` file in the corpus directory.

    Raises FileNotFoundError, saying what :func:`corpus_problem` says, when there is none.
    """
    problem = corpus_problem(path)
    corpus = find_corpus(path)
    if problem is not None or corpus is None:
        raise FileNotFoundError(problem)
    files = sorted(corpus.glob("*.jsonl"))
    out = []
    for file in files:
        with file.open(encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    rec = json.loads(line)
                    out.append(Trajectory(rec["id"], rec["source"], rec["messages"]))
    return out


def to_message(raw: dict[str, Any]) -> checkpoint_pb2.Message:
    msg = checkpoint_pb2.Message(
        role=_ROLES.get(raw.get("role", ""), checkpoint_pb2.ROLE_UNSPECIFIED),
        content=raw.get("content") or "",
        name=raw.get("name") or "",
        tool_call_id=raw.get("tool_call_id") or "",
    )
    for call in raw.get("tool_calls") or ():
        fn = call.get("function", {})
        msg.tool_calls.add(id=call.get("id", ""), name=fn.get("name", ""), arguments_json=fn.get("arguments", ""))
    return msg


def replay(trajectory: Trajectory) -> Iterator[Step]:
    """Yield one Step per message: the first sets up the session, each next one appends."""
    state = checkpoint_pb2.Checkpoint(schema_version=1, status=checkpoint_pb2.STATUS_RUNNING)
    state.model.model_id = "replayed"
    state.model.temperature = 0.0
    for i, raw in enumerate(trajectory.messages, start=1):
        patch = checkpoint_pb2.Checkpoint(step=i, current_step_id=f"step-{i}")
        if i == 1:
            patch.schema_version = 1
            patch.status = checkpoint_pb2.STATUS_RUNNING
            patch.goal = trajectory.id
            patch.model.CopyFrom(state.model)
        patch.messages.append(to_message(raw))
        state.MergeFrom(patch)
        yield Step(state=state.SerializeToString(deterministic=True), patch=patch.SerializeToString(deterministic=True))
