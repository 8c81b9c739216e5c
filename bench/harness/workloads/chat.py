"""The ``chat`` workload: short turns and a rolling summary; the state grows slowly."""

from __future__ import annotations

import random

from ckpt.v1 import checkpoint_pb2 as pb

from ...trajectories import Step
from .record import Clock, Recorder, message, start_session
from .text import Text


def build(rng: random.Random, steps: int) -> list[Step]:
    text, clock, rec = Text(rng), Clock(rng), Recorder()
    patch = pb.Checkpoint(step=1)
    start_session(patch, rng, text.prose(rng.randint(60, 200)))
    patch.messages.append(message(pb.ROLE_SYSTEM, text.prose(rng.randint(400, 1500)), clock.now))
    patch.messages.append(message(pb.ROLE_USER, text.prose(rng.randint(50, 400)), clock.tick()))
    if steps == 1:
        patch.status = pb.STATUS_DONE
    rec.commit(patch)
    for i in range(2, steps + 1):
        patch = pb.Checkpoint(step=i)
        # Turns alternate, starting with the assistant's reply to the first user message.
        role = pb.ROLE_ASSISTANT if i % 2 == 0 else pb.ROLE_USER
        patch.messages.append(message(role, text.prose(rng.randint(50, 400)), clock.tick()))
        if rng.random() < 0.12:
            patch.conversation_summary = text.prose(rng.randint(300, 1200))
        if rng.random() < 0.05:
            patch.working_memory[f"user.{text.idents(1)[0]}"] = text.prose(rng.randint(20, 120))
        if i == steps:
            patch.status = pb.STATUS_DONE
        rec.commit(patch)
    return rec.steps
