"""The ``trajectories`` workload: the shared corpus's real agent trajectories, replayed into a rich state."""

from __future__ import annotations

import os

from ckpt.v1 import checkpoint_pb2 as pb

from ... import trajectories
from ...trajectories import Step
from .record import EPOCH, Recorder, cache_key, tool_result


def replay_corpus(sessions: int, steps: int, directory: str | os.PathLike[str] | None) -> list[list[Step]]:
    """``sessions`` sessions of the corpus's trajectories in turn (cycled when there are more sessions than them).

    Raises FileNotFoundError when no corpus is found (see ``bench.trajectories``).
    """
    corpus = trajectories.load(directory)
    return [
        _replay(corpus[index % len(corpus)], steps, cycle=index // len(corpus), session=index)
        for index in range(sessions)
    ]


def _replay(traj: trajectories.Trajectory, steps: int, cycle: int, session: int) -> list[Step]:
    rec = Recorder()
    raws = traj.messages[:steps]
    now = EPOCH + 3_600 * session
    # tool call id -> (plan step id, call); a later call reusing an id wins, as
    # the next tool reply answers the latest call.
    open_calls: dict[str, tuple[str, pb.ToolCall]] = {}
    in_progress: list[str] = []
    for i, raw in enumerate(raws, start=1):
        now += 15
        patch = pb.Checkpoint(step=i)
        if i == 1:
            patch.schema_version = 1
            patch.status = pb.STATUS_RUNNING
            # Cycled sessions get a distinct goal so their states differ.
            patch.goal = traj.id if cycle == 0 else f"{traj.id}#{cycle}"
            patch.model.model_id = "replayed"
            patch.model.temperature = 0.0
        msg = trajectories.to_message(raw)
        msg.created_at.seconds = now
        patch.messages.append(msg)
        for n, call in enumerate(msg.tool_calls):
            step_id = f"step-{len(rec.state.plan) + len(patch.plan) + 1}"
            title = f"{call.name} {call.arguments_json}"
            patch.plan[step_id].CopyFrom(
                pb.PlanStep(
                    id=step_id,
                    title=title[:120],
                    status=pb.STEP_STATUS_IN_PROGRESS,
                    order=len(rec.state.plan) + len(patch.plan) + 1,
                )
            )
            if n == 0:  # the agent works on the first call of its turn first
                patch.current_step_id = step_id
            in_progress.append(step_id)
            open_calls[call.id] = (step_id, call)
        if msg.role == pb.ROLE_TOOL and msg.tool_call_id in open_calls:
            step_id, call = open_calls.pop(msg.tool_call_id)
            result = tool_result(call.name, call.arguments_json, msg.content, now, _looks_like_error(msg.content))
            patch.tool_cache[cache_key(call.name, result.canonical_args_json)].CopyFrom(result)
            done = pb.PlanStep()
            done.CopyFrom(rec.state.plan[step_id])
            done.status = pb.STEP_STATUS_DONE
            patch.plan[step_id].CopyFrom(done)
            at = in_progress.index(step_id)
            del in_progress[at]
            if rec.state.current_step_id == step_id:
                # On to the next call of the same turn; calls of older turns that
                # never got a reply are abandoned. "" (explicitly present) = none.
                patch.current_step_id = in_progress[at] if at < len(in_progress) else ""
        if i == len(raws):
            patch.status = pb.STATUS_DONE
        rec.commit(patch)
    return rec.steps


def _looks_like_error(output: str) -> bool:
    head = output.lstrip()[:200].lower()
    return head.startswith(("error", "traceback")) or "command not found" in head
