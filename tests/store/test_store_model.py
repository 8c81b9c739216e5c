"""The store against a model: random sequences of every store operation on a real LMDB directory.

Hypothesis drives writes (REPLACE and MERGE, with and without expected
versions and request ids), reads of any version (hot and cold), history
paging, forks, deletes, retention sweeps, label listings and restarts of the
store, under store configurations drawn per run (short chains, no caches,
compaction, retention). After every operation the outcome is checked against
a plain in-memory model of what a checkpoint store promises: every kept
version reads back as written, a conflict names the current head, a retried
request id writes nothing, retention keeps at least what it was asked to and
never strands a delta, and nothing survives a delete.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ckpt.codec import ChainPolicy, FrameKind
from ckpt.sidecar import (
    AlreadyExists,
    InvalidArgument,
    NotFound,
    PutRequest,
    PutResult,
    Retention,
    Store,
    StoreConfig,
    StoreError,
    VersionConflict,
    WriteMode,
)
from ckpt.v1 import checkpoint_pb2 as pb
from tests.store.store_model import (
    ANY_SESSION,
    DAY_NANOS,
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
from tests.store.support import put_request


class StoreModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="ckpt-model-"))
        self.model = Model()
        self.store: Store | None = None

    @initialize(
        max_depth=st.sampled_from((1, 2, 4, 64)),
        compact=st.booleans(),
        keep_last=st.sampled_from((None, 1, 2, 3)),
        by_age=st.booleans(),
        cache_size_bytes=st.sampled_from((0, 1 << 20)),
        encoder_cache_entries=st.sampled_from((0, 1, 1024)),
    )
    def open_store(
        self,
        max_depth: int,
        compact: bool,
        keep_last: int | None,
        by_age: bool,
        cache_size_bytes: int,
        encoder_cache_entries: int,
    ) -> None:
        self.config = StoreConfig(
            data_dir=self.root / "data",
            chain_policy=ChainPolicy(frame_cost_bytes=0, max_depth=max_depth),
            merge_message_type="ckpt.v1.Checkpoint" if compact else None,
            retention=Retention(keep_last_versions=keep_last, max_version_age_seconds=3600 if by_age else None),
            cache_size_bytes=cache_size_bytes,
            encoder_cache_entries=encoder_cache_entries,
            sweep_interval_seconds=3600,  # sweeps run only when a rule asks
        )
        self.compact = compact
        self.store = Store(self.config)

    def teardown(self) -> None:
        try:
            if self.store is not None:
                self.restart()  # a last restart: everything the model holds must be on disk
                self.check_every_kept_version()
        finally:
            if self.store is not None:
                self.store.close()
            shutil.rmtree(self.root, ignore_errors=True)

    # -- reading the store back -------------------------------------------------

    @property
    def s(self) -> Store:
        assert self.store is not None
        return self.store

    def same_state(self, got: bytes, want: bytes) -> bool:
        if not self.compact:
            return got == want
        # Compaction re-serializes a chain's first MERGE state: equal as messages, not as bytes.
        return pb.Checkpoint.FromString(got) == pb.Checkpoint.FromString(want)

    def check_every_kept_version(self) -> None:
        for sid, sess in self.model.sessions.items():
            for version, want in sess.versions.items():
                got = self.s.get(sid, version, use_cache=False)
                assert got.version == version
                assert self.same_state(got.state, want), (sid, version)

    # -- writes --------------------------------------------------------------

    def check_write(self, req: PutRequest, outcome: PutResult | StoreError) -> None:
        """Check one write's outcome against the model, then apply it to the model."""
        kind, version = self.model.expected(req)
        if kind == "conflict":
            assert isinstance(outcome, VersionConflict), outcome
            assert outcome.current_version == version
            assert f"version {version}" in str(outcome)
            return
        if kind == "reused":
            assert isinstance(outcome, InvalidArgument), outcome
            assert f"was used for a different write to session {req.session_id!r} (it made version {version})" in str(
                outcome
            )
            return
        assert isinstance(outcome, PutResult), outcome
        assert (outcome.replayed, outcome.version) == (kind == "replay", version)
        if kind == "write":
            new = self.model.apply(req, version)
            if not self.compact:
                assert outcome.state_size == len(new)

    def write(self, req: PutRequest) -> None:
        try:
            outcome: PutResult | StoreError = put_request(self.s, req)
        except StoreError as exc:
            outcome = exc
        self.check_write(req, outcome)

    @rule(
        session_id=st.sampled_from(SESSIONS),
        grow=st.booleans(),
        patch=PATCHES,
        expect=EXPECT,
        request_id=st.sampled_from(REQUEST_IDS),
        labels=LABELS,
    )
    def replace(self, session_id: str, grow: bool, patch: bytes, expect: str, request_id: str, labels: Labels) -> None:
        self.write(self.model.request(session_id, WriteMode.REPLACE, grow, patch, expect, request_id, labels))

    @rule(
        session_id=st.sampled_from(SESSIONS),
        patch=PATCHES,
        expect=EXPECT,
        request_id=st.sampled_from(REQUEST_IDS),
        labels=LABELS,
    )
    def merge(self, session_id: str, patch: bytes, expect: str, request_id: str, labels: Labels) -> None:
        self.write(self.model.request(session_id, WriteMode.MERGE, False, patch, expect, request_id, labels))

    @rule(writes=batches(min_size=2, max_size=6))
    def put_many(self, writes: list[BatchWrite]) -> None:
        """Queued together, so they share group commits: a conflict among them fails alone, in order."""
        requests = self.model.plan(writes)
        for req, outcome in zip(requests, self.s.put_many(requests), strict=True):
            self.check_write(req, outcome)

    @rule(
        source=st.sampled_from(SESSIONS),
        pick=st.sampled_from(("latest", "oldest", "pruned", "beyond")),
        new_id=st.sampled_from(ANY_SESSION),
        labels=LABELS,
    )
    def fork(self, source: str, pick: str, new_id: str, labels: Labels) -> None:
        version = self.model.fork_version(source, pick)
        outcome = self.model.expected_fork(source, version, new_id)
        if outcome == "exists":
            with pytest.raises(AlreadyExists, match=f"new_session_id '{new_id}' already exists"):
                self.s.fork(source, version, new_id, labels=labels)
        elif outcome == "missing":
            with pytest.raises(NotFound, match=f"session '{source}'"):
                self.s.fork(source, version, new_id, labels=labels)
        else:
            info = self.s.fork(source, version, new_id, labels=labels)
            resolved = self.model.apply_fork(source, version, new_id, labels)
            assert (info.head_version, info.forked_from_session_id, info.forked_from_version) == (1, source, resolved)

    @rule(session_id=st.sampled_from(ANY_SESSION))
    def delete(self, session_id: str) -> None:
        if session_id not in self.model.sessions:
            with pytest.raises(NotFound):
                self.s.delete_session(session_id)
            return
        assert self.s.delete_session(session_id) == self.model.apply_delete(session_id)
        with pytest.raises(NotFound):
            self.s.get(session_id)
        with pytest.raises(NotFound):
            self.s.list_versions(session_id)

    # -- reads -----------------------------------------------------------------

    @rule(
        session_id=st.sampled_from(ANY_SESSION),
        pick=st.sampled_from(("latest", "any", "pruned", "beyond")),
        index=st.integers(0, 1000),
        use_cache=st.booleans(),
    )
    def get(self, session_id: str, pick: str, index: int, use_cache: bool) -> None:
        sess = self.model.sessions.get(session_id)
        if sess is None:
            with pytest.raises(NotFound, match=f"session '{session_id}' does not exist"):
                self.s.get(session_id, use_cache=use_cache)
            return
        kept = sorted(sess.versions)
        version = {"latest": 0, "any": kept[index % len(kept)], "pruned": sess.first - 1, "beyond": sess.head + 1}[pick]
        if pick == "pruned" and version < 1:
            version = 0
        if version and version not in sess.versions:
            with pytest.raises(NotFound, match=f"version {version}"):
                self.s.get(session_id, version, use_cache=use_cache)
            return
        got = self.s.get(session_id, version, use_cache=use_cache)
        want = version or sess.head
        assert got.version == got.info.version == want
        assert self.same_state(got.state, sess.versions[want])

    @rule(session_id=st.sampled_from(SESSIONS), page_size=st.integers(1, 5))
    def history(self, session_id: str, page_size: int) -> None:
        sess = self.model.sessions.get(session_id)
        if sess is None:
            with pytest.raises(NotFound):
                self.s.list_versions(session_id, page_size=page_size)
            return
        seen: list[int] = []
        token = ""
        while True:
            page, token = self.s.list_versions(session_id, page_size=page_size, page_token=token)
            assert len(page) <= page_size
            seen += [i.version for i in page]
            if not token:
                break
        assert seen == sorted(sess.versions, reverse=True)
        info = self.s.session(session_id)
        assert (info.head_version, info.first_version, info.version_count) == (
            sess.head,
            sess.first,
            len(sess.versions),
        )
        assert (info.forked_from_session_id, info.forked_from_version) == sess.forked_from
        assert info.labels == sess.labels

    @rule(label=st.sampled_from(("team", "env")), value=st.sampled_from(("x", "y")))
    def list_by_label(self, label: str, value: str) -> None:
        found, token = self.s.list_sessions(label_filter={label: value}, page_size=100)
        assert token == ""
        want = {sid for sid, sess in self.model.sessions.items() if sess.labels.get(label) == value}
        assert {i.session_id for i in found} == want

    # -- retention, restarts -------------------------------------------------

    def _sweep(self, now_nanos: int | None) -> None:
        before = {sid: (sess.first, sess.head) for sid, sess in self.model.sessions.items()}
        self.s.sweep(now_nanos=now_nanos)
        retention = self.config.retention
        for sid, sess in self.model.sessions.items():
            first, head = before[sid]
            asked = first  # the highest first version retention may leave
            if retention.keep_last_versions is not None:
                asked = max(asked, head - retention.keep_last_versions + 1)
            if retention.max_version_age_seconds is not None and now_nanos is not None:
                asked = head  # every version but the head is older than the far-future "now"
            asked = min(asked, head)  # the head always stays
            kept = self.s.session(sid).first_version
            kinds = {i.version: i.frame_kind for i in self.s.list_versions(sid, page_size=1000)[0]}
            assert min(kinds) == kept
            # At least what was asked, and at most one chain more: the cut is at the chain
            # start of the oldest version asked for, so no delta is left without its FULL frame (or
            # at a PREFIX frame, which reads only newer ones). The sweep folds quiet heads after
            # retention: a head folded is FULL, and the run before it PREFIX frames; a typed head folded
            # as its canonical state keeps the version before it whole, a FULL frame too (folds.py).
            assert first <= kept <= asked, (sid, first, kept, asked)
            assert kinds[kept] in (FrameKind.FULL, FrameKind.PREFIX)
            compacted_fold = self.compact and kinds[head] is FrameKind.FULL
            last = min(asked, head - 2 if compacted_fold else head - 1)
            starts = [v for v in range(kept + 1, last + 1) if kinds[v] is FrameKind.FULL]
            assert not starts, (sid, kept, asked)
            sess.first = kept
            sess.versions = {v: s for v, s in sess.versions.items() if v >= kept}

    @rule()
    def sweep_now(self) -> None:
        self._sweep(None)

    @rule()
    def sweep_days_later(self) -> None:
        """Request ids expire; with an age limit, every version but each head's chain goes."""
        self._sweep(time.time_ns() + 2 * DAY_NANOS)
        self.model.requests.clear()

    @rule()
    def restart(self) -> None:
        """Close and reopen: encoders and caches are gone, everything committed stays."""
        self.s.close()
        self.store = Store(self.config)

    @precondition(lambda self: self.store is not None)
    @invariant()
    def session_count_matches(self) -> None:
        found, _ = self.s.list_sessions(page_size=100)
        assert sorted(i.session_id for i in found) == sorted(self.model.sessions)


# Twice the profile's examples: each one is a whole history of a store (~30 ms).
_profile = settings()  # the loaded profile (default or thorough, see conftest)
StoreModel.TestCase.settings = settings(_profile, max_examples=2 * _profile.max_examples, stateful_step_count=40)
test_store_against_model = StoreModel.TestCase
