"""A real sidecar against the model: random histories of every write and read RPC, through the Python client.

The same oracle as ``test_store_model.py`` (tests/store_model.py), one level
out: a ``ckpt serve`` process on a unix socket, driven only by
``CheckpointClient`` (unary puts and merges with expected versions and
request ids, PutStream batches mixing conflicts, gets of any version, paged
history, forks, deletes, label listings). Each example writes sessions under
its own prefix, so one sidecar serves them all; the last one is stopped with
SIGTERM, restarted, and every version the model holds is read back.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import grpc
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from ckpt.sidecar import PutRequest, WriteMode
from ckpt.sidecar.client import (
    AlreadyExistsError,
    CheckpointClient,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
)
from ckpt.v1 import service_pb2
from tests.store.store_model import (
    ANY_SESSION,
    EXPECT,
    LABELS,
    PATCHES,
    REQUEST_IDS,
    SESSIONS,
    BatchWrite,
    Labels,
    Model,
    batches,
)
from tests.support import start_sidecar

_WIRE_MODE = {WriteMode.REPLACE: service_pb2.WRITE_MODE_REPLACE, WriteMode.MERGE: service_pb2.WRITE_MODE_MERGE}


def _wire(req: PutRequest, session_id: str, labels: Labels) -> service_pb2.PutRequest:
    msg = service_pb2.PutRequest(
        session_id=session_id, state=req.state, mode=_WIRE_MODE[req.mode], request_id=req.request_id, labels=labels
    )
    if req.expected_version is not None:
        msg.expected_version = req.expected_version
    return msg


class SidecarModel(RuleBasedStateMachine):
    #: Set by the test before running the machine: the sidecar every example talks to.
    client: CheckpointClient

    def __init__(self) -> None:
        super().__init__()
        self.model = Model()
        # Sessions of earlier examples stay in the sidecar: every id here carries this prefix.
        self.prefix = uuid.uuid4().hex[:12]

    def sid(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    # -- writes --------------------------------------------------------------

    def _write(self, req: PutRequest) -> None:
        """One unary write through the client; checked against the model and applied to it."""
        kind, version = self.model.expected(req)
        call = self.client.merge if req.mode is WriteMode.MERGE else self.client.put
        # The client sends a request id of its own when given None; "" in the model means none.
        rid = req.request_id or None
        labels = {**req.labels, "run": self.prefix}
        if kind == "conflict":
            with pytest.raises(ConflictError) as conflict:
                call(self.sid(req.session_id), req.state, expected_version=req.expected_version, request_id=rid)
            assert conflict.value.current_version == version
            assert conflict.value.code is grpc.StatusCode.ABORTED
            return
        if kind == "reused":
            with pytest.raises(InvalidArgumentError, match=f"made version {version}"):
                call(
                    self.sid(req.session_id),
                    req.state,
                    expected_version=req.expected_version,
                    request_id=rid,
                    labels=labels,
                )
            return
        got = call(
            self.sid(req.session_id), req.state, expected_version=req.expected_version, request_id=rid, labels=labels
        )
        assert (got.replayed, got.version) == (kind == "replay", version)
        if kind == "write":
            new = self.model.apply(req, version)
            assert got.state_size == len(new)

    @rule(
        session_id=st.sampled_from(SESSIONS),
        grow=st.booleans(),
        patch=PATCHES,
        expect=EXPECT,
        request_id=st.sampled_from(REQUEST_IDS),
        labels=LABELS,
    )
    def put(self, session_id: str, grow: bool, patch: bytes, expect: str, request_id: str, labels: Labels) -> None:
        self._write(self.model.request(session_id, WriteMode.REPLACE, grow, patch, expect, request_id, labels))

    @rule(
        session_id=st.sampled_from(SESSIONS),
        patch=PATCHES,
        expect=EXPECT,
        request_id=st.sampled_from(REQUEST_IDS),
        labels=LABELS,
    )
    def merge(self, session_id: str, patch: bytes, expect: str, request_id: str, labels: Labels) -> None:
        self._write(self.model.request(session_id, WriteMode.MERGE, False, patch, expect, request_id, labels))

    @rule(
        writes=batches(min_size=1, max_size=8),
        batch_size=st.integers(1, 3),
    )
    def put_stream(self, writes: list[BatchWrite], batch_size: int) -> None:
        """One PutStream: results in order, a conflict fails alone (ABORTED with the head), writes keep order."""
        requests = self.model.plan(writes)
        wire = [_wire(req, self.sid(req.session_id), {"run": self.prefix}) for req in requests]
        results = list(self.client.put_stream(wire, batch_size=batch_size))
        assert len(results) == len(requests)
        for req, result in zip(requests, results, strict=True):
            kind, version = self.model.expected(req)
            if kind == "conflict":
                assert result.HasField("error"), result
                assert (result.error.code, result.error.current_version) == (grpc.StatusCode.ABORTED.value[0], version)
                continue
            if kind == "reused":
                assert result.HasField("error"), result
                assert result.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
                assert f"made version {version}" in result.error.message
                continue
            assert result.HasField("response"), result
            assert (result.response.replayed, result.response.version) == (kind == "replay", version)
            if kind == "write":
                assert result.response.state_size == len(self.model.apply(req, version))

    @rule(
        source=st.sampled_from(SESSIONS),
        pick=st.sampled_from(("latest", "oldest", "pruned", "beyond")),
        new_id=st.sampled_from(ANY_SESSION),
        labels=LABELS,
    )
    def fork(self, source: str, pick: str, new_id: str, labels: Labels) -> None:
        version = self.model.fork_version(source, pick)
        outcome = self.model.expected_fork(source, version, new_id)
        call_labels = {**labels, "run": self.prefix}
        if outcome == "exists":
            with pytest.raises(AlreadyExistsError, match="already exists"):
                self.client.fork(self.sid(source), self.sid(new_id), version=version, labels=call_labels)
        elif outcome == "missing":
            with pytest.raises(NotFoundError, match=self.sid(source)):
                self.client.fork(self.sid(source), self.sid(new_id), version=version, labels=call_labels)
        else:
            info = self.client.fork(self.sid(source), self.sid(new_id), version=version, labels=call_labels)
            resolved = self.model.apply_fork(source, version, new_id, labels)
            assert (info.head_version, info.forked_from_session_id, info.forked_from_version) == (
                1,
                self.sid(source),
                resolved,
            )

    @rule(session_id=st.sampled_from(ANY_SESSION))
    def delete(self, session_id: str) -> None:
        if session_id not in self.model.sessions:
            with pytest.raises(NotFoundError):
                self.client.delete(self.sid(session_id))
            return
        assert self.client.delete(self.sid(session_id)) == self.model.apply_delete(session_id)
        with pytest.raises(NotFoundError):
            self.client.get(self.sid(session_id))

    # -- reads -----------------------------------------------------------------

    @rule(session_id=st.sampled_from(ANY_SESSION), pick=st.sampled_from(("latest", "oldest", "beyond")))
    def get(self, session_id: str, pick: str) -> None:
        sess = self.model.sessions.get(session_id)
        version = self.model.fork_version(session_id, pick)
        if sess is None or (version and version not in sess.versions):
            with pytest.raises(NotFoundError):
                self.client.get(self.sid(session_id), version)
            return
        got = self.client.get(self.sid(session_id), version)
        want = version or sess.head
        assert (got.version, got.info.version) == (want, want)
        assert got.state == sess.versions[want]

    @rule(session_id=st.sampled_from(SESSIONS), page_size=st.integers(1, 4))
    def history(self, session_id: str, page_size: int) -> None:
        sess = self.model.sessions.get(session_id)
        if sess is None:
            with pytest.raises(NotFoundError):
                list(self.client.history(self.sid(session_id), page_size=page_size))
            return
        versions = list(self.client.history(self.sid(session_id), page_size=page_size))
        assert [v.version for v in versions] == sorted(sess.versions, reverse=True)
        assert [v.state_size for v in versions] == [len(sess.versions[v.version]) for v in versions]

    @rule(label=st.sampled_from(("team", "env")), value=st.sampled_from(("x", "y")))
    def list_by_label(self, label: str, value: str) -> None:
        found = {s.session_id for s in self.client.sessions(labels={"run": self.prefix, label: value}, page_size=3)}
        want = {self.sid(n) for n, sess in self.model.sessions.items() if sess.labels.get(label) == value}
        assert found == want

    @invariant()
    def sessions_match(self) -> None:
        found = {s.session_id: s for s in self.client.sessions(labels={"run": self.prefix})}
        assert sorted(found) == sorted(self.sid(n) for n in self.model.sessions)
        for name, sess in self.model.sessions.items():
            info = found[self.sid(name)]
            assert (info.head_version, info.version_count) == (sess.head, len(sess.versions))
            assert {k: v for k, v in info.labels.items() if k != "run"} == sess.labels


def test_sidecar_against_model(tmp_path: Path) -> None:
    last: list[SidecarModel] = []

    class Machine(SidecarModel):
        def teardown(self) -> None:
            last[:] = [self]

    sidecar = start_sidecar(tmp_path / "data")
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            Machine.client = client
            profile = settings()  # the loaded profile (see conftest): half its examples, each ~25 RPCs or more
            run_state_machine_as_test(
                Machine,
                settings=settings(profile, max_examples=max(10, profile.max_examples // 2), stateful_step_count=25),
            )
    finally:
        # Everything the last example's model holds must survive a graceful restart of the sidecar.
        assert sidecar.stop() == 0, sidecar.log()
    restarted = start_sidecar(tmp_path / "data")
    try:
        machine = last[0]
        with CheckpointClient(restarted.unix_target) as client:
            for name, sess in machine.model.sessions.items():
                for version, state in sess.versions.items():
                    assert client.get(machine.sid(name), version).state == state
    finally:
        assert restarted.stop() == 0, restarted.log()
