"""A synthetic agent that edits its state in place (seeded, reproducible).

Where the trajectory workload mostly appends messages, this one rewrites map
entries (working memory, plan step status) and a few scalars every step, and
appends a short decision: the case where a patch supersedes earlier bytes.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from ckpt.v1 import checkpoint_pb2 as pb

from .trajectories import Step

_WORDS = [
    "check",
    "the",
    "failing",
    "test",
    "read",
    "the",
    "module",
    "trace",
    "the",
    "call",
    "path",
    "the",
    "cache",
    "key",
    "is",
    "stale",
    "retry",
    "with",
    "backoff",
    "the",
    "user",
    "wants",
    "a",
    "summary",
    "compare",
    "both",
    "branches",
    "run",
    "the",
    "linter",
    "the",
    "fixture",
    "leaks",
    "a",
    "file",
    "handle",
]


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choices(_WORDS, k=n))


def session(seed: int, steps: int = 60, memory_keys: int = 40, plan_steps: int = 12) -> Iterator[Step]:
    """Yield ``steps`` writes of one session; see trajectories.Step for the two forms."""
    rng = random.Random(seed)
    state = pb.Checkpoint(schema_version=1, goal=_sentence(rng, 20), status=pb.STATUS_RUNNING)
    for k in range(memory_keys):
        state.working_memory[f"mem-{k}"] = _sentence(rng, 30)
    for k in range(plan_steps):
        state.plan[f"s{k}"].CopyFrom(
            pb.PlanStep(id=f"s{k}", title=_sentence(rng, 8), status=pb.STEP_STATUS_PENDING, order=k)
        )
    yield Step(state=state.SerializeToString(deterministic=True), patch=state.SerializeToString(deterministic=True))
    for i in range(2, steps + 1):
        patch = pb.Checkpoint(step=i, current_step_id=f"s{rng.randrange(plan_steps)}")
        for k in rng.sample(range(memory_keys), 2):
            patch.working_memory[f"mem-{k}"] = _sentence(rng, 30)
        sid = patch.current_step_id
        edited = pb.PlanStep()
        edited.CopyFrom(state.plan[sid])
        edited.status = rng.choice([pb.STEP_STATUS_IN_PROGRESS, pb.STEP_STATUS_DONE])
        patch.plan[sid].CopyFrom(edited)
        patch.decisions.add(id=f"d{i}", step_id=sid, choice=_sentence(rng, 6), reasoning=_sentence(rng, 15))
        state.MergeFrom(patch)
        yield Step(state=state.SerializeToString(deterministic=True), patch=patch.SerializeToString(deterministic=True))


def sessions(count: int = 10, steps: int = 60) -> list[list[Step]]:
    return [list(session(seed, steps)) for seed in range(count)]
