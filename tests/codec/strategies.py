"""Hypothesis strategies for ckpt.v1.Checkpoint states and merge patches."""

from __future__ import annotations

import random

from hypothesis import strategies as st

from ckpt.v1 import checkpoint_pb2 as pb

_text = st.text(max_size=40)  # any unicode, including astral and control characters
_ids = st.text(alphabet="abcdefghij0123456789-", min_size=1, max_size=6)


@st.composite
def messages(draw: st.DrawFn) -> pb.Message:
    msg = pb.Message(role=pb.Role.Name(draw(st.sampled_from(list(pb.Role.values())))), content=draw(_text))
    for _ in range(draw(st.integers(0, 2))):
        msg.tool_calls.add(id=draw(_ids), name=draw(_text), arguments_json=draw(_text))
    return msg


@st.composite
def checkpoints(draw: st.DrawFn, *, partial: bool = False) -> pb.Checkpoint:
    """A Checkpoint with a random subset of fields set; ``partial`` for a merge patch."""
    cp = pb.Checkpoint()
    if draw(st.booleans()):
        cp.step = draw(st.integers(0, 2**64 - 1))  # 0 is a meaningful explicit value
    if draw(st.booleans()):
        cp.status = pb.Status.Name(draw(st.sampled_from(list(pb.Status.values()))))  # type: ignore[assignment]
    if draw(st.booleans()):
        cp.goal = draw(_text)
    if draw(st.booleans()):
        cp.current_step_id = draw(_ids)
    if draw(st.booleans()):
        cp.model.temperature = draw(st.floats(0, 2))
        cp.model.seed = draw(st.integers(-(2**63), 2**63 - 1))
    if not partial and draw(st.booleans()):
        cp.schema_version = 1
    for _ in range(draw(st.integers(0, 2))):
        key = draw(_ids)
        cp.plan[key].CopyFrom(
            pb.PlanStep(id=key, title=draw(_text), status=pb.StepStatus.Name(draw(st.integers(0, 5))))
        )
    for _ in range(draw(st.integers(0, 2))):
        cp.working_memory[draw(_ids)] = draw(_text)
    for _ in range(draw(st.integers(0, 2))):
        cp.tool_cache[draw(_ids)].CopyFrom(pb.ToolResult(tool=draw(_text), result=draw(st.binary(max_size=64))))
    for _ in range(draw(st.integers(0, 3))):
        cp.messages.append(draw(messages()))
    if draw(st.booleans()):
        cp.discoveries.add(fact=draw(_text), source=draw(_text))
    return cp


@st.composite
def big_checkpoints(draw: st.DrawFn, *, min_bytes: int = 10 * 1024 * 1024) -> pb.Checkpoint:
    """A Checkpoint of at least ``min_bytes``: compressible text plus incompressible binary."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    cp = draw(checkpoints())
    words = [rng.randbytes(rng.randint(2, 6)).hex() for _ in range(4000)]
    text_bytes = draw(st.integers(min_bytes // 2, min_bytes))
    cp.messages.add(role=pb.ROLE_TOOL, content=" ".join(rng.choices(words, k=text_bytes // 8)))
    cp.tool_cache["blob"].CopyFrom(pb.ToolResult(tool="fetch", result=rng.randbytes(min_bytes - text_bytes + 1)))
    return cp


def serialize(cp: pb.Checkpoint) -> bytes:
    return cp.SerializeToString(deterministic=True)
