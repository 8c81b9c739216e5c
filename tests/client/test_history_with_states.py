"""A session's history with its states through a real sidecar: the Python clients (sync and asyncio) and
the Node.js client return, for every version, the bytes a Get of it returns; pages end early by the
states' bytes under the message limit, and at a few MiB under a larger one; a single state over the limit is
RESOURCE_EXHAUSTED naming it. States that extend the next older ones travel as their suffixes, joined back
by the clients."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from ckpt.sidecar.client import AsyncCheckpointClient, CheckpointClient, DataLossError, ResourceExhaustedError
from ckpt.sidecar.client.base import join_state_suffixes
from ckpt.sidecar.server.heap import REPLY_PAGE_BYTES
from ckpt.v1 import service_pb2, service_pb2_grpc
from tests.client.test_node_client import node_command
from tests.store.support import merge_patch, replace_state
from tests.support import (
    AGENT_STATE,
    Sidecar,
    agent_file,
    agent_state_class,
    agent_step,
    descriptor_set_of,
    start_sidecar,
)

LIMIT = 128 * 1024  # the least --max-message-bytes: states of up to 64 KiB, a listing page's bytes too
VERSIONS = 40
# Every version of each session, read by the Node client: [version, state as hex, labels].
_NODE_HISTORY = """
const { CheckpointClient } = require(process.argv[1]);
const [target, sessions, pageSize, startVersion] = process.argv.slice(2);
(async () => {
  const client = new CheckpointClient(target);
  const out = {};
  for (const session of sessions.split(',')) {
    const versions = await client.history(session, {
      includeStates: true, pageSize: Number(pageSize), startVersion: Number(startVersion),
    });
    out[session] = versions.map((v) => [v.version, v.state.toString('hex'), v.labels]);
  }
  out.without = (await client.history(sessions.split(',')[0])).map((v) => v.state.length);
  client.close();
  console.log(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(1); });
"""


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    """A sidecar at the least message limit holding a REPLACE session, an untyped and a typed MERGE
    session (several chains each, under the default chain policy) and one of ~20 KB states."""
    s = start_sidecar(tmp_path_factory.mktemp("history") / "data", "--max-message-bytes", str(LIMIT))
    with CheckpointClient(s.unix_target) as c:
        c.register_type(descriptor_set_of(agent_file()))
        state_class = agent_state_class()
        for v in range(1, VERSIONS + 1):
            c.put("replace", replace_state("replace", v), labels={"step": str(v)})
            if v == 1:
                c.put("merge", replace_state("merge", 1))
            else:
                c.merge("merge", merge_patch("merge", v))
            c.merge("typed", agent_step(state_class, v).SerializeToString(), message_type=AGENT_STATE)
        for v in range(1, 11):
            c.put("wide", replace_state("wide", v) * 7)  # ~21 KB: three fit a page
    yield s
    assert s.stop() == 0, s.log()


SESSIONS = ("replace", "merge", "typed")


def gets(client: CheckpointClient, session: str, versions: range) -> list[bytes]:
    return [bytes(client.get(session, v).state) for v in versions]


def test_the_python_clients_list_what_gets_return(sidecar: Sidecar) -> None:
    with CheckpointClient(sidecar.unix_target) as c:
        for session in SESSIONS:
            want = gets(c, session, range(VERSIONS, 0, -1))
            for page_size in (1, 7, 100):
                listed = list(c.history(session, include_states=True, page_size=page_size))
                assert [v.version for v in listed] == list(range(VERSIONS, 0, -1))
                assert [v.state for v in listed] == want, (session, page_size)
            assert all(not v.state for v in c.history(session))  # states only when asked
            from_17 = list(c.history(session, include_states=True, page_size=5, start_version=17))
            assert [v.state for v in from_17] == want[VERSIONS - 17 :]
        assert [v.labels["step"] for v in c.history("replace", include_states=True)][:2] == [str(VERSIONS), "39"]

    async def asynchronous() -> dict[str, list[tuple[int, bytes]]]:
        async with AsyncCheckpointClient(sidecar.unix_target) as a:
            return {
                s: [(v.version, v.state) async for v in a.history(s, include_states=True, page_size=9)]
                for s in SESSIONS
            }

    by_async = asyncio.run(asynchronous())
    with CheckpointClient(sidecar.unix_target) as c:
        for session in SESSIONS:
            assert by_async[session] == list(
                zip(range(VERSIONS, 0, -1), gets(c, session, range(VERSIONS, 0, -1)), strict=True)
            )


def test_the_node_client_lists_what_gets_return(sidecar: Sidecar) -> None:
    proc = subprocess.run(
        node_command(_NODE_HISTORY, sidecar.unix_target, ",".join(SESSIONS), "6", "30"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    with CheckpointClient(sidecar.unix_target) as c:
        for session in SESSIONS:
            assert [(v, bytes.fromhex(h)) for v, h, _ in out[session]] == list(
                zip(range(30, 0, -1), gets(c, session, range(30, 0, -1)), strict=True)
            )
    assert out["replace"][0][2] == {"step": "30"}
    assert out["without"] == [0] * VERSIONS


# Histories with a limit, read by the Node client: [versions, each page's page_size asked], and the
# error a limit of 0 gets.
_NODE_LIMITED = """
const { CheckpointClient } = require(process.argv[1]);
const [target] = process.argv.slice(2);
(async () => {
  const client = new CheckpointClient(target);
  const asked = [];
  const call = client.call.bind(client);
  client.call = (method, request, ...rest) => {
    asked.push(request.page_size);
    return call(method, request, ...rest);
  };
  const out = {};
  const read = async (session, options) => {
    asked.length = 0;
    const versions = (await client.history(session, { includeStates: true, ...options })).map((v) => v.version);
    return [versions, [...asked]];
  };
  out.paged = await read('replace', { pageSize: 6, startVersion: 30, limit: 8 });
  out.early = await read('wide', { limit: 5 });  // pages end early: three states fit one
  out.sidecarDefault = await read('replace', { pageSize: 0, limit: 7 });
  out.past = await read('replace', { pageSize: 10, startVersion: 3, limit: 50 });
  try {
    await client.history('replace', { limit: 0 });
  } catch (e) {
    out.zero = `${e.name}: ${e.message}`;
  }
  client.close();
  console.log(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(1); });
"""


def test_the_node_client_reads_no_page_past_a_limit(sidecar: Sidecar) -> None:
    proc = subprocess.run(node_command(_NODE_LIMITED, sidecar.unix_target), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["paged"] == [list(range(30, 22, -1)), [6, 2]]
    assert out["early"] == [[10, 9, 8, 7, 6], [5, 2]]
    assert out["sidecarDefault"] == [list(range(VERSIONS, VERSIONS - 7, -1)), [7]]
    assert out["past"] == [[3, 2, 1], [10]]  # fewer than the limit: the history ended
    assert out["zero"] == "RangeError: limit must be in 1..9007199254740991, got 0"


def _pages(target: str, request: service_pb2.ListVersionsRequest) -> list[service_pb2.ListVersionsResponse]:
    pages = []
    with grpc.insecure_channel(target) as channel:  # the pages themselves, which history hides
        stub = service_pb2_grpc.CheckpointServiceStub(channel)
        while True:
            page = stub.ListVersions(request, timeout=10)
            pages.append(page)
            request.page_token = page.next_page_token
            if not request.page_token:
                return pages


def test_a_page_with_states_ends_early_under_the_message_limit(sidecar: Sidecar) -> None:
    with CheckpointClient(sidecar.unix_target) as c:
        size = len(c.get("wide").state)
        assert 3 * size < LIMIT // 2 < 4 * size  # three states fit a page's 64 KiB, four do not
        request = service_pb2.ListVersionsRequest(session_id="wide", page_size=1000, include_states=True)
        pages = _pages(sidecar.unix_target, request)
        assert all(page.ByteSize() <= LIMIT for page in pages)
        assert [[v.version for v in page.versions] for page in pages] == [[10, 9, 8], [7, 6, 5], [4, 3, 2], [1]]
        assert [v.state for v in c.history("wide", include_states=True)] == gets(c, "wide", range(10, 0, -1))
        assert len(list(c.history("wide", page_size=1000))) == 10  # without states: one page


def test_a_single_state_over_the_message_limit_is_resource_exhausted_naming_it(tmp_path: Path) -> None:
    big = replace_state("big", 1) * 60  # ~180 KB, stored under a larger limit
    sidecar = start_sidecar(tmp_path / "data", "--max-message-bytes", str(4 << 20))
    try:
        with CheckpointClient(sidecar.unix_target) as c:
            c.put("big", b"\x08\x01")
            c.put("big", big)
            c.put("big", b"\x08\x03")
    finally:
        assert sidecar.stop() == 0, sidecar.log()
    sidecar = start_sidecar(tmp_path / "data", "--max-message-bytes", str(LIMIT))
    try:
        with CheckpointClient(sidecar.unix_target, retries=0) as c:
            # The page ends before it; the next page holds it alone and cannot.
            listed = c.history("big", include_states=True)
            assert next(iter(listed)).version == 3
            with pytest.raises(ResourceExhaustedError) as raised:
                list(c.history("big", include_states=True))
            message = str(raised.value)
            assert f"session 'big' version 2: its state is {len(big)} bytes" in message, message
            assert f"more than the {LIMIT // 2} bytes a page of versions with their states holds" in message, message
            assert f"--max-message-bytes ({LIMIT})" in message, message
            with pytest.raises(ResourceExhaustedError, match="over the sidecar's message limit"):
                c.get("big", 2)  # as a Get of it fails
            assert [v.version for v in c.history("big")] == [3, 2, 1]
            assert [v.state for v in c.history("big", include_states=True, start_version=1)] == [b"\x08\x01"]
            assert sidecar.process.poll() is None, sidecar.log()
    finally:
        assert sidecar.stop() == 0, sidecar.log()


def test_a_state_of_the_largest_size_a_put_takes_is_listed_with_all_its_labels(tmp_path: Path) -> None:
    # A one-version page is the state plus its metadata: the envelope kept clear above max_state_bytes.
    labels = {f"label-{i:02d}": "v" * 128 for i in range(64)}
    largest = b"x" * (LIMIT // 2)
    sidecar = start_sidecar(tmp_path / "data", "--max-message-bytes", str(LIMIT))
    try:
        with CheckpointClient(sidecar.unix_target, retries=0) as c:
            c.put("edge", largest, labels=labels)
            listed = list(c.history("edge", include_states=True))
            assert [(v.version, v.state, dict(v.labels)) for v in listed] == [(1, largest, labels)]
            assert c.get("edge").state == largest
    finally:
        assert sidecar.stop() == 0, sidecar.log()


def test_pages_with_states_end_at_the_reply_page_bytes_yet_hold_a_larger_state(tmp_path: Path) -> None:
    # Under the default message limit, a page of large states ends at REPLY_PAGE_BYTES, not at the limit.
    size = REPLY_PAGE_BYTES * 3 // 8  # two fit a page, three do not
    larger = REPLY_PAGE_BYTES + 1  # a page of its own
    sidecar = start_sidecar(tmp_path / "data")
    try:
        with CheckpointClient(sidecar.unix_target, retries=0) as c:
            for v in range(1, 6):
                c.put("large", bytes([v]) * size)
            c.put("large", b"\x07" * larger)
            request = service_pb2.ListVersionsRequest(session_id="large", page_size=1000, include_states=True)
            pages = []
            with grpc.insecure_channel(sidecar.unix_target, options=[("grpc.max_receive_message_length", -1)]) as ch:
                stub = service_pb2_grpc.CheckpointServiceStub(ch)
                while True:
                    page = stub.ListVersions(request, timeout=30)
                    pages.append([(v.version, len(v.state)) for v in page.versions])
                    request.page_token = page.next_page_token
                    if not request.page_token:
                        break
            assert pages == [[(6, larger)], [(5, size), (4, size)], [(3, size), (2, size)], [(1, size)]]
            listed = list(c.history("large", include_states=True))
            assert [v.state for v in listed] == gets(c, "large", range(6, 0, -1))
    finally:
        assert sidecar.stop() == 0, sidecar.log()


@pytest.mark.parametrize("session", SESSIONS)
def test_states_that_extend_the_older_ones_are_sent_as_suffixes(sidecar: Sidecar, session: str) -> None:
    """With states_as_suffixes, a state that begins with the next older entry's comes as the bytes after it;
    each page's oldest, and a state that does not begin so, whole; joined back, what Gets return."""
    whole, suffixes = (
        _pages(
            sidecar.unix_target,
            service_pb2.ListVersionsRequest(
                session_id=session, page_size=7, include_states=True, states_as_suffixes=as_suffixes
            ),
        )
        for as_suffixes in (False, True)
    )
    assert [[v.version for v in p.versions] for p in suffixes] == [[v.version for v in p.versions] for p in whole]
    for sent, full in zip(suffixes, whole, strict=True):
        assert not sent.versions[-1].HasField("state_suffix")
        for i, (v, w) in enumerate(zip(sent.versions, full.versions, strict=True)):
            if v.HasField("state_suffix"):
                older = full.versions[i + 1].state
                assert not v.state and w.state == older + v.state_suffix
            else:
                assert v.state == w.state and (
                    i + 1 == len(full.versions) or not w.state.startswith(full.versions[i + 1].state)
                )
    sent_bytes = sum(len(v.state) + len(v.state_suffix) for p in suffixes for v in p.versions)
    whole_bytes = sum(len(v.state) for p in whole for v in p.versions)
    if session == "replace":  # each version's state is new: none extends the one before it
        assert sent_bytes == whole_bytes
    else:  # a typed session's compacted states begin anew
        assert sent_bytes * 2 < whole_bytes
    for page in suffixes:
        join_state_suffixes(page)
    assert [v.state for p in suffixes for v in p.versions] == [v.state for p in whole for v in p.versions]


def test_a_page_ending_with_a_suffix_is_data_loss_naming_the_version() -> None:
    page = service_pb2.ListVersionsResponse(
        versions=[
            service_pb2.VersionInfo(version=3, state_suffix=b"c"),
            service_pb2.VersionInfo(version=2, state_suffix=b"b"),
        ]
    )
    with pytest.raises(DataLossError, match=r"^ListVersions: version 2, the oldest of its page, came as a 1-byte"):
        join_state_suffixes(page)
    assert page.versions[1].state_suffix == b"b"  # nothing joined


#: A gRPC server answering ListVersions with a page whose oldest version is a suffix, then the Node client's
#: history against it: the error it throws.
_NODE_SUFFIX_WITHOUT_STATE = """
const path = require('path');
const dir = path.dirname(process.argv[1]);
const grpc = require(dir + '/node_modules/@grpc/grpc-js');
const protoLoader = require(dir + '/node_modules/@grpc/proto-loader');
const { PROTO_ROOT } = require(dir + '/proto_root');
const { CheckpointClient } = require(process.argv[1]);
const definition = protoLoader.loadSync('ckpt/v1/service.proto', { includeDirs: [PROTO_ROOT], keepCase: true });
const { CheckpointService } = grpc.loadPackageDefinition(definition).ckpt.v1;
const server = new grpc.Server();
server.addService(CheckpointService.service, {
  ListVersions: (call, reply) => reply(null, { versions: [{ version: 3, state_suffix: Buffer.from('c') },
    { version: 2, state_suffix: Buffer.from('bb') }] }),
});
server.bindAsync(process.argv[2], grpc.ServerCredentials.createInsecure(), async (err) => {
  if (err) throw err;
  const client = new CheckpointClient(process.argv[2]);
  try {
    await client.history('s', { includeStates: true });
    console.log(JSON.stringify({ thrown: null }));
  } catch (e) {
    console.log(JSON.stringify({ code: e.code, message: e.message }));
  }
  client.close();
  server.forceShutdown();
});
"""


def test_the_node_client_refuses_a_page_ending_with_a_suffix_naming_the_version(tmp_path: Path) -> None:
    proc = subprocess.run(
        node_command(_NODE_SUFFIX_WITHOUT_STATE, f"unix:{tmp_path / 'fake.sock'}"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {
        "code": grpc.StatusCode.DATA_LOSS.value[0],
        "message": "15 DATA_LOSS: ListVersions: version 2, the oldest of its page, came as a 2-byte suffix of no state",
    }
