"""The scale run's sessions: cheap, deterministic ~2-3 KB states, one REPLACE then MERGE patches each."""

from __future__ import annotations

import random

from ckpt.v1 import checkpoint_pb2 as pb

from ...sidecar import PutRequest, WriteMode
from .. import synthetic

VERSIONS_PER_SESSION = 3


def _template(seed: int, size: int) -> bytes:
    """A ~size-byte Checkpoint: goal, model, plan and working memory."""
    rng = random.Random(seed)
    cp = pb.Checkpoint(schema_version=1, status=pb.STATUS_RUNNING, goal=synthetic._sentence(rng, 20))
    cp.model.model_id = f"model-{seed % 3}"
    cp.model.temperature = 0.2
    for k in range(4):
        cp.plan[f"p{k}"].CopyFrom(pb.PlanStep(id=f"p{k}", title=synthetic._sentence(rng, 6), order=k))
    k = 0
    while cp.ByteSize() < size:
        cp.working_memory[f"mem-{k}"] = synthetic._sentence(rng, rng.randrange(10, 30))
        k += 1
    return cp.SerializeToString(deterministic=True)


class ScaleData:
    """Cheap, deterministic states: a template plus one appended message per version.

    Each version's patch is a Checkpoint setting ``step`` and appending a
    message that names the session; it is serialized once per (version,
    phrase) with a placeholder, and the session id is spliced in. A MERGE
    state is the concatenation of its patches (protobuf merge semantics).
    """

    def __init__(self, width: int, templates: int = 16, phrases: int = 8) -> None:
        self.width = width
        self.templates = [_template(t, 2000 + 1000 * t // templates) for t in range(templates)]
        placeholder = b"#" * width
        rng = random.Random(7)
        self._tails: list[list[tuple[bytes, bytes]]] = []
        for v in range(1, VERSIONS_PER_SESSION + 1):
            row = []
            for _ in range(phrases):
                patch = pb.Checkpoint(step=v, current_step_id=f"p{v % 4}")
                patch.messages.add(
                    role=pb.ROLE_ASSISTANT if v % 2 else pb.ROLE_TOOL,
                    content=f"{placeholder.decode()} step {v}: {synthetic._sentence(rng, rng.randrange(6, 14))}",
                )
                raw = patch.SerializeToString(deterministic=True)
                head, sep, tail = raw.partition(placeholder)
                assert sep and placeholder not in tail
                row.append((head, tail))
            self._tails.append(row)

    def session_id(self, i: int) -> str:
        return f"s{i:0{self.width - 1}d}"

    def patch(self, i: int, version: int) -> bytes:
        head, tail = self._tails[version - 1][(i * 7 + version) % len(self._tails[version - 1])]
        return head + self.session_id(i).encode() + tail

    def first(self, i: int) -> bytes:
        return self.templates[i % len(self.templates)] + self.patch(i, 1)

    def state(self, i: int, version: int) -> bytes:
        return self.first(i) + b"".join(self.patch(i, v) for v in range(2, version + 1))

    def request(self, i: int, version: int) -> PutRequest:
        """The write that makes ``version`` of session ``i``: a REPLACE first, then MERGE patches."""
        if version == 1:
            return PutRequest(self.session_id(i), self.first(i), WriteMode.REPLACE)
        return PutRequest(self.session_id(i), self.patch(i, version), WriteMode.MERGE)

    def requests(self, lo: int, hi: int) -> list[PutRequest]:
        """Every version of sessions lo..hi-1, session after session (key order)."""
        return [self.request(i, v) for i in range(lo, hi) for v in range(1, VERSIONS_PER_SESSION + 1)]
