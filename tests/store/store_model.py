"""An in-memory model of what a checkpoint store promises, for the model-based tests.

The oracle ``tests/test_store_model.py`` checks the Store against in-process,
and ``tests/test_sidecar_model.py`` checks a real sidecar against over gRPC.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from hypothesis import strategies as st

from ckpt.sidecar import PutRequest, WriteMode
from ckpt.v1 import checkpoint_pb2 as pb

SESSIONS = ("a", "b", "c", "d")
ANY_SESSION = (*SESSIONS, "e")  # "e" only ever exists as a fork
REQUEST_IDS = ("", "r1", "r2", "r3")  # "" = no request id
Labels = dict[str, str]
EXPECT = st.sampled_from(("none", "head", "stale", "create"))  # what expected_version a write carries
LABELS = st.dictionaries(st.sampled_from(("team", "env")), st.sampled_from(("x", "y")), max_size=2)
DAY_NANOS = 24 * 3600 * 10**9


def _patch(step: int, content: str, key: str, value: str) -> bytes:
    """A small Checkpoint patch: a new message appends, the step and a memory entry are overwritten."""
    cp = pb.Checkpoint(step=step, messages=[pb.Message(role=pb.ROLE_ASSISTANT, content=content)])
    cp.working_memory[key] = value
    return cp.SerializeToString(deterministic=True)


# Cheap to draw on purpose: a costly strategy here starves the write rules of steps.
PATCHES = st.builds(
    _patch, st.integers(0, 2**32), st.text(max_size=60), st.sampled_from(("k1", "k2")), st.text(max_size=20)
)


#: One queued write of a batch: (session, mode, grow, patch, expect, request id).
BatchWrite = tuple[str, WriteMode, bool, bytes, str, str]


def batches(*, min_size: int, max_size: int) -> st.SearchStrategy[list[BatchWrite]]:
    write = st.tuples(
        st.sampled_from(SESSIONS),
        st.sampled_from((WriteMode.REPLACE, WriteMode.MERGE)),
        st.booleans(),
        PATCHES,
        EXPECT,
        st.sampled_from(REQUEST_IDS),
    )
    return st.lists(write, min_size=min_size, max_size=max_size)


@dataclass
class Session:
    """What the model knows of one session."""

    versions: dict[int, bytes] = field(default_factory=dict)  # kept versions only
    head: int = 0
    first: int = 1
    labels: dict[str, str] = field(default_factory=dict)
    forked_from: tuple[str, int] = ("", 0)


#: What a write asks: mode, expected version, labels, state.
Asked = tuple[WriteMode, int | None, tuple[tuple[str, str], ...], bytes]


def asked_by(req: PutRequest) -> Asked:
    return (req.mode, req.expected_version, tuple(sorted(req.labels.items())), bytes(req.state))


@dataclass
class Model:
    """What a checkpoint store promises, kept in memory: the oracle the store is checked against."""

    sessions: dict[str, Session] = field(default_factory=dict)
    #: (session, request id) -> the version its first attempt wrote, and what that attempt asked
    requests: dict[tuple[str, str], tuple[int, Asked]] = field(default_factory=dict)

    def request(
        self, session_id: str, mode: WriteMode, grow: bool, patch: bytes, expect: str, request_id: str, labels: Labels
    ) -> PutRequest:
        """The write a client would send, given what the model says the session holds now."""
        sess = self.sessions.get(session_id)
        head = sess.head if sess else 0
        prev = sess.versions[head] if sess else b""
        # A REPLACE either grows the previous state (a delta against it) or is a new one.
        state = (prev + patch if grow else patch) if mode is WriteMode.REPLACE else patch
        expected = {"none": None, "head": head, "stale": head + 1, "create": 0}[expect]
        return PutRequest(session_id, state, mode, expected, request_id, labels)

    def expected(self, req: PutRequest) -> tuple[str, int]:
        """What the store must answer: ("replay" or "reused", version), ("conflict", head) or ("write", new version)."""
        sess = self.sessions.get(req.session_id)
        head = sess.head if sess else 0
        first = self.requests.get((req.session_id, req.request_id)) if req.request_id else None
        if first is not None:
            # A retry (the same write again) writes nothing and answers as the first did; a request
            # id reused for another write is refused, naming the version the first one made.
            version, asked = first
            return ("replay" if asked == asked_by(req) else "reused"), version
        if req.expected_version is not None and req.expected_version != head:
            return "conflict", head
        return "write", head + 1

    def apply(self, req: PutRequest, version: int) -> bytes:
        """Record a committed write in the model; return the session's new state."""
        sess = self.sessions.setdefault(req.session_id, Session())
        new = sess.versions[sess.head] + req.state if req.mode is WriteMode.MERGE and sess.head else req.state
        sess.head = version
        sess.versions[version] = new
        sess.labels.update(req.labels)
        if req.request_id:
            self.requests[(req.session_id, req.request_id)] = (version, asked_by(req))
        return new

    def plan(self, writes: list[BatchWrite]) -> list[PutRequest]:
        """The requests of a batch, each built against its session as it will be when that write runs.

        Writes to one session apply in queue order, so each is planned on a copy of
        the model advanced by the writes before it; the model itself is unchanged.
        """
        ahead = copy.deepcopy(self)
        requests = []
        for session_id, mode, grow, patch, expect, request_id in writes:
            req = ahead.request(session_id, mode, grow, patch, expect, request_id, {})
            kind, version = ahead.expected(req)
            if kind == "write":
                ahead.apply(req, version)
            requests.append(req)
        return requests

    def fork_version(self, source: str, pick: str) -> int:
        """The version a fork of ``source`` names: 0 = latest, the oldest kept, one pruned, or one not yet written."""
        src = self.sessions.get(source)
        if src is None:
            return 0
        return max(0, {"latest": 0, "oldest": src.first, "pruned": src.first - 1, "beyond": src.head + 1}[pick])

    def expected_fork(self, source: str, version: int, new_id: str) -> str:
        """What a fork must answer: "exists" (the new id is taken), "missing" (no such source or version), "ok"."""
        src = self.sessions.get(source)
        if new_id in self.sessions:
            return "exists"
        if src is None or (version and version not in src.versions):
            return "missing"
        return "ok"

    def apply_fork(self, source: str, version: int, new_id: str, labels: Labels) -> int:
        """Record a fork; return the source version it copied."""
        src = self.sessions[source]
        resolved = version or src.head
        self.sessions[new_id] = Session(
            versions={1: src.versions[resolved]}, head=1, labels=dict(labels), forked_from=(source, resolved)
        )
        return resolved

    def apply_delete(self, session_id: str) -> int:
        """Record a delete; return how many versions it removed. Its request ids go with it."""
        sess = self.sessions.pop(session_id)
        self.requests = {k: v for k, v in self.requests.items() if k[0] != session_id}
        return len(sess.versions)
