"""The ``factual`` workload: a ~10 KB state of facts edited in place, never growing."""

from __future__ import annotations

import random

from ckpt.v1 import checkpoint_pb2 as pb

from ...trajectories import Step
from .record import Clock, Recorder, start_session
from .text import Text

_FACT_KEYS = 16
_PLAN_STEPS = 8


def _fact(text: Text) -> str:
    return text.prose(text.rng.randint(250, 450))


def build(rng: random.Random, steps: int) -> list[Step]:
    text, clock, rec = Text(rng), Clock(rng), Recorder()
    keys = [f"fact.{k}.{name}" for k, name in enumerate(text.idents(_FACT_KEYS))]
    plan_ids = [f"s{k}" for k in range(_PLAN_STEPS)]
    handoff_fields = ("in_progress", "decided", "next", "can_wait", "waiting_on")

    patch = pb.Checkpoint(step=1, current_step_id=plan_ids[0])
    start_session(patch, rng, text.prose(rng.randint(150, 300)))
    patch.conversation_summary = text.prose(rng.randint(800, 1200))
    for field in handoff_fields:
        setattr(patch.handoff, field, text.prose(rng.randint(80, 200)))
    for order, step_id in enumerate(plan_ids):
        patch.plan[step_id].CopyFrom(
            pb.PlanStep(
                id=step_id,
                title=text.sentence(4, 9),
                status=pb.STEP_STATUS_PENDING,
                order=order,
                notes=text.prose(rng.randint(60, 160)),
            )
        )
    for key in keys:
        patch.working_memory[key] = _fact(text)
    if steps == 1:
        patch.status = pb.STATUS_DONE
    rec.commit(patch)
    for i in range(2, steps + 1):
        clock.tick()
        patch = pb.Checkpoint(step=i)
        for key in rng.sample(keys, rng.randint(1, 3)):
            patch.working_memory[key] = _fact(text)
        step = pb.PlanStep()
        step.CopyFrom(rec.state.plan[rng.choice(plan_ids)])
        step.status = rng.choice((pb.STEP_STATUS_IN_PROGRESS, pb.STEP_STATUS_DONE, pb.STEP_STATUS_PENDING))
        step.notes = text.prose(rng.randint(60, 160))
        patch.plan[step.id].CopyFrom(step)
        patch.current_step_id = step.id
        if rng.random() < 0.3:
            setattr(patch.handoff, rng.choice(handoff_fields), text.prose(rng.randint(80, 200)))
        if rng.random() < 0.1:
            patch.conversation_summary = text.prose(rng.randint(800, 1200))
        if i == steps:
            patch.status = pb.STATUS_DONE
        elif rec.state.status != pb.STATUS_RUNNING:
            patch.status = pb.STATUS_RUNNING
        elif rng.random() < 0.1:
            # Pauses for a human now and then; resumes on the next step.
            patch.status = pb.STATUS_WAITING_FOR_APPROVAL
        rec.commit(patch)
    return rec.steps
