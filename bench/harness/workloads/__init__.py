"""Seeded, reproducible checkpoint sequences for the benchmark harness.

A workload is a list of sessions; a session is a list of ``bench.trajectories.Step``,
one per agent step, each carrying both write forms of the same change:

- ``state``: the whole new ``ckpt.v1.Checkpoint`` (what a REPLACE write sends);
- ``patch``: only the changed fields (what a MERGE write sends), such that parsing
  ``previous_state + patch`` gives a message equal to ``state``. The first step's
  patch is the whole first state.

Everything is serialized with ``deterministic=True`` and drawn from a
``random.Random`` seeded by (workload, seed, session index), never from the global
generator or the clock, so the same arguments give byte-identical output.

Workloads (``WORKLOADS`` holds the one-line descriptions and the run sizes), one module each
(``replayed``, ``chat``, ``coding``, ``factual``, ``large``; ``record`` and ``text`` are what they share):

- ``trajectories``: the 60 real agent trajectories of the shared corpus (see
  ``bench.trajectories``), replayed one message per step into a richer state than
  ``bench.trajectories.replay`` builds: every tool call opens an IN_PROGRESS plan
  step (and becomes ``current_step_id``); its tool reply is cached in
  ``tool_cache`` under the xxh3-128 of (tool name, canonical arguments) and closes
  the plan step; the last step sets ``status`` DONE. The seed is ignored: the
  data is real.
- ``chat``: a chat assistant. Short user/assistant turns (50-400 chars) and a
  rolling ``conversation_summary`` rewritten every few turns; the state grows
  slowly, patches are a few hundred bytes.
- ``coding``: a coding agent. Every step edits a few lines of a 5-30 KB source
  file held in ``working_memory`` (its ``artifacts`` reference follows), calls a
  tool whose output is 2-20 KB (test log, file listing, grep, file view), caches
  read-only tool results and moves plan steps along. Edited map entries are
  replaced whole, so patches are tens of KB.
- ``factual``: a ~10 KB state of facts edited in place (working memory entries
  rewritten, plan statuses, handoff, summary, scalars): no growth at all, the
  case where merged patches pile up superseded bytes.
- ``large``: a state over 20 MiB built at the first step (a long history of
  messages, a big tool cache), then a few KB appended or rewritten per step.

Synthetic text is drawn from a fixed vocabulary with Zipf-like word frequencies,
code-like lines, log lines, test logs and file listings, so it compresses about
like real agent text (zstd -3: roughly 3-6x) rather than like random bytes or
repeated filler, both of which would flatter or punish compression unfairly.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass

from ...trajectories import Step
from . import chat, coding, factual, large, replayed

__all__ = ["WORKLOADS", "WorkloadInfo", "generate"]


@dataclass(frozen=True, slots=True)
class WorkloadInfo:
    """What a workload is and how big a run of it is."""

    name: str
    description: str
    full: tuple[int, int]
    quick: tuple[int, int]


WORKLOADS: dict[str, WorkloadInfo] = {
    info.name: info
    for info in (
        WorkloadInfo(
            "trajectories",
            "60 real agent trajectories (coding, tool use, web), one message per step: state ~1-530 KB"
            " (mean ~37 KB); each step appends a message, opens/closes plan steps, caches tool results",
            full=(60, 200),
            quick=(16, 8),
        ),
        WorkloadInfo(
            "chat",
            "chat assistant: state ~2-30 KB (mean ~14 KB) growing slowly; each step appends one 50-400 char"
            " turn, the summary is rewritten every few turns",
            full=(128, 100),
            quick=(16, 8),
        ),
        WorkloadInfo(
            "coding",
            "coding agent: state ~60-550 KB (mean ~270 KB); each step rewrites a 5-30 KB file entry with a"
            " few lines changed and appends 2-20 KB tool outputs",
            full=(64, 24),
            quick=(8, 8),
        ),
        WorkloadInfo(
            "factual",
            "facts edited in place: state ~9-10 KB that never grows; each step rewrites a few"
            " working-memory entries, a plan step and scalars",
            full=(128, 60),
            quick=(16, 8),
        ),
        WorkloadInfo(
            "large",
            "very large state: ~23 MB (22 MiB) built at step 1 (long history, big tool cache); each next"
            " step appends or rewrites a few KB",
            full=(2, 10),
            quick=(1, 3),
        ),
    )
}


def generate(
    name: str,
    *,
    sessions: int,
    steps: int,
    seed: int = 0,
    trajectories_dir: str | os.PathLike[str] | None = None,
) -> list[list[Step]]:
    """Return ``sessions`` sessions of at most ``steps`` steps of workload ``name``.

    Synthetic workloads give exactly ``steps`` steps per session; ``trajectories``
    stops a session early when its trajectory has fewer messages.
    Raises ValueError for an unknown workload or a size below 1, and
    FileNotFoundError when the trajectory corpus is needed but missing.
    """
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    for param, value in (("sessions", sessions), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"workload {name!r}: {param} must be an integer >= 1, got {value!r}")
    if name == "trajectories":
        return replayed.replay_corpus(sessions, steps, trajectories_dir)
    build = _SYNTHETIC[name]
    # A string seed is hashed (SHA-512) by random.Random, so sessions of
    # different workloads and seeds never share a stream, unlike seed + index.
    return [build(random.Random(f"ckpt-bench/{name}/{seed}/{index}"), steps) for index in range(sessions)]


_SYNTHETIC: dict[str, Callable[[random.Random, int], list[Step]]] = {
    "chat": chat.build,
    "coding": coding.build,
    "factual": factual.build,
    "large": large.build,
}
