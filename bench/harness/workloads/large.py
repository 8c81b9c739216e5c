"""The ``large`` workload: a state over 20 MiB built at the first step, then a few KB changed per step."""

from __future__ import annotations

import json
import random

from ckpt.v1 import checkpoint_pb2 as pb

from ...trajectories import Step
from .record import Clock, Recorder, cache_key, message, start_session, tool_result
from .text import Text, log_uniform

# Over 20 MB however counted (20 MiB = 20,971,520 bytes), with margin.
_LARGE_TARGET = 22 * 1024 * 1024


def build(rng: random.Random, steps: int) -> list[Step]:
    text, clock, rec = Text(rng), Clock(rng), Recorder()
    plan_ids = [f"p{k}" for k in range(40)]
    keys = [f"note.{k}" for k in range(64)]

    patch = pb.Checkpoint(step=1, current_step_id=plan_ids[25])
    start_session(patch, rng, text.prose(rng.randint(200, 500)))
    patch.conversation_summary = text.prose(4_000)
    for order, step_id in enumerate(plan_ids):
        status = (
            pb.STEP_STATUS_DONE if order < 25 else pb.STEP_STATUS_IN_PROGRESS if order == 25 else pb.STEP_STATUS_PENDING
        )
        patch.plan[step_id].CopyFrom(pb.PlanStep(id=step_id, title=text.sentence(4, 10), status=status, order=order))
    for key in keys:
        patch.working_memory[key] = text.prose(rng.randint(200, 600))
    for k in range(150):
        decision = patch.decisions.add(id=f"d{k}", step_id=rng.choice(plan_ids[:26]), choice=text.sentence(4, 10))
        decision.reasoning = text.prose(rng.randint(200, 800))
        decision.alternatives.extend(text.sentence(3, 8) for _ in range(rng.randint(1, 3)))
        decision.decided_at.seconds = clock.tick(1, 30)
    for _ in range(300):
        found = patch.discoveries.add(fact=text.sentence(), source=f"src/{'/'.join(text.idents(2))}.py")
        found.observed_at.seconds = clock.tick(1, 30)
        found.confidence = round(rng.uniform(0.4, 1.0), 2)
    patch.messages.append(message(pb.ROLE_SYSTEM, text.prose(6_000), clock.now))
    patch.messages.append(message(pb.ROLE_USER, text.prose(rng.randint(300, 1500)), clock.tick()))
    size = patch.ByteSize()
    turn = 0
    while size < _LARGE_TARGET:
        turn += 1
        size += _large_turn(text, clock, patch, turn, log_uniform(rng, 1_024, 64_000))
    if steps == 1:
        patch.status = pb.STATUS_DONE
    rec.commit(patch)
    for i in range(2, steps + 1):
        patch = pb.Checkpoint(step=i)
        _large_turn(text, clock, patch, turn + i, log_uniform(rng, 1_024, 4_096))
        patch.working_memory[rng.choice(keys)] = text.prose(rng.randint(200, 600))
        if rng.random() < 0.3:
            step = pb.PlanStep()
            step.CopyFrom(rec.state.plan[rng.choice(plan_ids[25:])])
            step.status = rng.choice((pb.STEP_STATUS_IN_PROGRESS, pb.STEP_STATUS_DONE))
            patch.plan[step.id].CopyFrom(step)
            patch.current_step_id = step.id
        if i == steps:
            patch.status = pb.STATUS_DONE
        rec.commit(patch)
    return rec.steps


def _large_turn(text: Text, clock: Clock, patch: pb.Checkpoint, turn: int, output_chars: int) -> int:
    """Append one tool call and its reply (cached when side-effect free); returns the bytes added, roughly."""
    rng = text.rng
    tool = rng.choice(("execute_bash", "read_file", "search", "run_tests"))
    args = json.dumps({"target": "/".join(text.idents(2)), "limit": rng.randrange(10, 500)})
    assistant = message(pb.ROLE_ASSISTANT, text.prose(rng.randint(100, 800)), clock.tick(5, 60))
    call = assistant.tool_calls.add(id=f"call_{turn}", name=tool, arguments_json=args)
    output = text.tool_output(output_chars)
    patch.messages.append(assistant)
    patch.messages.append(message(pb.ROLE_TOOL, output, clock.tick(1, 30), tool_call_id=call.id))
    added = len(assistant.content) + len(args) + len(output) + 64
    if tool != "run_tests" and rng.random() < 0.5:
        result = tool_result(tool, args, output, clock.now)
        patch.tool_cache[cache_key(tool, result.canonical_args_json)].CopyFrom(result)
        added += len(output) + len(args) + 64
    return added
