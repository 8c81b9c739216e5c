"""Listing replies fit the sidecar's message limit, however many labels their entries carry.

Pages were bounded by count only (100 by default, up to 1,000), while an entry
with a session's 64 longest labels takes ~13 KB: with `--max-message-bytes
131072` a page of 20 such sessions or versions failed RESOURCE_EXHAUSTED
("Sent message larger than max"), and `ckpt history` could not list the
session at all. Pages now end early at the limit (less the 64 KiB envelope).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import grpc
import pytest

from ckpt.codec import FrameKind
from ckpt.sidecar.server.convert import session_info_pb, version_info_pb
from ckpt.sidecar.store import SessionInfo, VersionInfo, WriteMode
from ckpt.sidecar.store.keys import MAX_LABEL_KEY_BYTES, MAX_LABEL_VALUE_BYTES, MAX_LABELS, MAX_SESSION_ID_BYTES
from ckpt.sidecar.store.listings import session_info_bytes, version_info_bytes
from ckpt.v1 import service_pb2, service_pb2_grpc
from tests.support import Sidecar, ckpt, start_sidecar

LIMIT = 128 * 1024  # the smallest --max-message-bytes allowed
U64_MAX = 2**64 - 1

# A session's most labels, each at its longest (values of 2-byte characters).
WIDEST = {f"k{i:02d}".ljust(MAX_LABEL_KEY_BYTES, "x"): "é" * (MAX_LABEL_VALUE_BYTES // 2) for i in range(MAX_LABELS)}


@pytest.mark.parametrize("labels", [{}, {"a": ""}, WIDEST], ids=["none", "one-empty", "widest"])
def test_the_page_byte_estimates_are_upper_bounds(labels: dict[str, str]) -> None:
    version = VersionInfo(U64_MAX, U64_MAX, U64_MAX, FrameKind.PATCH, U64_MAX, U64_MAX, labels, WriteMode.MERGE)
    sid = "é" * (MAX_SESSION_ID_BYTES // 2)
    session = SessionInfo(sid, U64_MAX, U64_MAX, U64_MAX, U64_MAX, labels, U64_MAX, U64_MAX, sid, U64_MAX)
    # Each entry inside its reply: the entry's tag and length count too.
    one_version = service_pb2.ListVersionsResponse(versions=[version_info_pb(version)]).ByteSize()
    one_session = service_pb2.ListSessionsResponse(sessions=[session_info_pb(session)]).ByteSize()
    assert version_info_bytes(version) >= one_version
    assert session_info_bytes(session) >= one_session
    assert version_info_bytes(version) - one_version < 64  # and close: pages are not needlessly short


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    s = start_sidecar(tmp_path_factory.mktemp("pages") / "data", "--max-message-bytes", str(LIMIT))
    stub = service_pb2_grpc.CheckpointServiceStub(grpc.insecure_channel(s.unix_target))
    for n in range(20):
        for v in range(1 if n else 30):  # wide-00 has 30 versions
            stub.Put(service_pb2.PutRequest(session_id=f"wide-{n:02d}", state=bytes([8, v]), labels=WIDEST), timeout=10)
    yield s
    assert s.stop() == 0, s.log()


def test_versions_with_the_widest_labels_are_listed_whole_in_pages_under_the_limit(sidecar: Sidecar) -> None:
    with grpc.insecure_channel(sidecar.unix_target) as channel:
        stub = service_pb2_grpc.CheckpointServiceStub(channel)
        seen, token, pages = [], "", 0
        while True:
            page = stub.ListVersions(
                service_pb2.ListVersionsRequest(session_id="wide-00", page_size=1000, page_token=token), timeout=10
            )
            assert page.ByteSize() <= LIMIT
            assert all(dict(v.labels) == WIDEST for v in page.versions)
            seen += [v.version for v in page.versions]
            pages += 1
            if not (token := page.next_page_token):
                break
    assert seen == list(range(30, 0, -1))
    assert pages >= 3


@pytest.mark.parametrize("label_filter", [{}, {"k00".ljust(MAX_LABEL_KEY_BYTES, "x"): "é" * 64}], ids=["all", "label"])
def test_sessions_with_the_widest_labels_are_listed_whole_in_pages_under_the_limit(
    sidecar: Sidecar, label_filter: dict[str, str]
) -> None:
    with grpc.insecure_channel(sidecar.unix_target) as channel:
        stub = service_pb2_grpc.CheckpointServiceStub(channel)
        seen, token = [], ""
        while True:
            page = stub.ListSessions(
                service_pb2.ListSessionsRequest(page_size=1000, page_token=token, label_filter=label_filter),
                timeout=10,
            )
            assert page.ByteSize() <= LIMIT
            seen += [s.session_id for s in page.sessions]
            if not (token := page.next_page_token):
                break
    assert seen == [f"wide-{n:02d}" for n in range(20)]


def test_ckpt_history_lists_a_session_of_wide_versions(sidecar: Sidecar) -> None:
    done = ckpt("history", "wide-00", "--target", sidecar.unix_target)
    assert done.returncode == 0, done.stderr.decode()
    listed = [json.loads(line)["version"] for line in done.stdout.decode().splitlines()]
    assert listed == [str(v) for v in range(30, 0, -1)]
