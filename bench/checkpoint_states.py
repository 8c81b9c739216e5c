"""Checkpoint states of a chosen size, and small MERGE patches for them (the sidecar and store benchmarks)."""

from __future__ import annotations

from ckpt.v1 import checkpoint_pb2 as pb

_TEXT = (
    "Read the failing test, trace the call path into the cache module, and check whether the key is stale; "
    "the user wants a short summary of both branches before the linter runs again on the fixture that leaks. "
)


def _message(i: int, chars: int) -> pb.Message:
    text = (_TEXT * (chars // len(_TEXT) + 1))[:chars]
    return pb.Message(role=pb.ROLE_ASSISTANT if i % 2 else pb.ROLE_USER, content=f"[{i}] {text}", name="agent")


def make_state(size: int, *, step: int = 0) -> bytes:
    """A Checkpoint of about ``size`` bytes: a goal, a plan, and ~1 KB conversation messages."""
    ck = pb.Checkpoint(schema_version=1, step=step, status=pb.STATUS_RUNNING, goal="fix the flaky cache test")
    ck.plan["s1"].CopyFrom(pb.PlanStep(id="s1", title="reproduce", status=pb.STEP_STATUS_DONE, order=1))
    ck.plan["s2"].CopyFrom(pb.PlanStep(id="s2", title="fix and verify", status=pb.STEP_STATUS_IN_PROGRESS, order=2))
    ck.working_memory["branch"] = "fix/cache-key"
    i = 0
    while ck.ByteSize() < size:
        ck.messages.append(_message(i, min(1000, max(16, size - ck.ByteSize() - 16))))
        i += 1
    return ck.SerializeToString()


def make_patches(n: int) -> list[bytes]:
    """MERGE patches of ~300 B: a new step and one appended message."""
    return [pb.Checkpoint(step=1000 + i, messages=[_message(1000 + i, 240)]).SerializeToString() for i in range(n)]
