"""What every workload family shares: the recorder of steps, a session clock, and message/tool-result builders."""

from __future__ import annotations

import json
import random

import xxhash

from ckpt.v1 import checkpoint_pb2 as pb

from ...trajectories import Step

# A fixed start (2026-01-01T00:00:00Z) so timestamps never depend on when the
# generator runs.
EPOCH = 1_767_225_600


class Recorder:
    """Keeps the live state and records one Step per committed patch.

    Merging each patch into a live message costs O(patch); only the
    serialization of the state (which the Step needs anyway) is O(state).
    """

    def __init__(self) -> None:
        self.state = pb.Checkpoint()
        self.steps: list[Step] = []

    def commit(self, patch: pb.Checkpoint) -> None:
        self.state.MergeFrom(patch)
        state = self.state.SerializeToString(deterministic=True)
        # The first patch is the whole state: share the bytes rather than
        # encode (and hold) a 20 MB state twice.
        encoded = state if not self.steps else patch.SerializeToString(deterministic=True)
        self.steps.append(Step(state=state, patch=encoded))


class Clock:
    """Seconds since EPOCH for one session, moving forward by a few seconds a step."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self.now = EPOCH + rng.randrange(30 * 86_400)

    def tick(self, lo: int = 2, hi: int = 90) -> int:
        self.now += self._rng.randint(lo, hi)
        return self.now


def _canonical_json(arguments_json: str) -> str:
    """Sorted keys, no spaces; text that is not JSON is kept as it is (it still keys the cache)."""
    if not arguments_json.strip():
        return "{}"
    try:
        value = json.loads(arguments_json)
    except ValueError:
        return arguments_json
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def cache_key(tool: str, canonical_args_json: str) -> str:
    # NUL cannot occur in a tool name, so (tool, args) pairs never collide by concatenation.
    return xxhash.xxh3_128_hexdigest(f"{tool}\0{canonical_args_json}".encode())


def tool_result(tool: str, arguments_json: str, output: str, at: int, is_error: bool = False) -> pb.ToolResult:
    result = pb.ToolResult(
        tool=tool, canonical_args_json=_canonical_json(arguments_json), result=output.encode(), is_error=is_error
    )
    result.created_at.seconds = at
    return result


def message(role: pb.Role, content: str, at: int, tool_call_id: str = "") -> pb.Message:
    msg = pb.Message(role=role, content=content, tool_call_id=tool_call_id)
    msg.created_at.seconds = at
    return msg


def _model(rng: random.Random) -> pb.ModelParams:
    return pb.ModelParams(
        model_id=rng.choice(_MODELS),
        temperature=rng.choice((0.0, 0.2, 0.7, 1.0)),
        top_p=rng.choice((0.9, 0.95, 1.0)),
        seed=rng.randrange(2**31),
        max_output_tokens=rng.choice((1024, 4096, 8192)),
    )


def start_session(patch: pb.Checkpoint, rng: random.Random, goal: str) -> None:
    patch.schema_version = 1
    patch.status = pb.STATUS_RUNNING
    patch.goal = goal
    patch.model.CopyFrom(_model(rng))


_MODELS = ("gpt-4o-2024-08-06", "claude-sonnet-4-20250514", "gemini-2.5-pro", "llama-3.3-70b-instruct")
