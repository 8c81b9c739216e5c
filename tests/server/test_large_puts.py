"""Large puts through a real sidecar: checked and encoded in its blocking pool (Store.encode_put), then
committed by the writer, in order with the writes around them (a unary Put's caller waits for its answer;
a PutStream's later writes wait for it)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckpt.codec import ChainPolicy
from ckpt.sidecar.client import CheckpointClient
from ckpt.sidecar.store import ENCODE_AHEAD_BYTES
from ckpt.v1 import checkpoint_pb2 as pb
from ckpt.v1 import service_pb2
from tests.support import Sidecar, ckpt, start_sidecar

#: Versions of a chain under the store's default chain policy: a MERGE chain of a large state writes
#: segments (codec FORMAT.md §14), so it ends at this many versions, not after max_depth frames.
MAX_CHAIN_VERSIONS = ChainPolicy().max_chain_versions


def large_state(seed: int) -> bytes:
    """More than ENCODE_AHEAD_BYTES of fields 2 (a well-formed MERGE patch too) of random letters."""
    letters = random.Random(seed).randbytes(ENCODE_AHEAD_BYTES + 64_000).translate((bytes(range(97, 123)) * 10)[:256])
    pieces = [letters[i : i + 16_000] for i in range(0, len(letters), 16_000)]
    return b"".join(b"\x12" + bytes([(len(p) & 0x7F) | 0x80, len(p) >> 7]) + p for p in pieces)


def patch(n: int) -> bytes:
    return pb.Checkpoint(step=n, messages=[pb.Message(content=f"patch {n}")]).SerializeToString()


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    s = start_sidecar(tmp_path / "data")
    yield s
    assert s.stop() == 0, s.log()


def test_large_replaces_and_merges_starting_chains_commit_in_order_through_unary_puts(sidecar: Sidecar) -> None:
    with CheckpointClient(sidecar.unix_target) as client:
        assert client.put("big", large_state(1)).version == 1
        state = large_state(2)
        assert client.put("big", state).frame_kind == service_pb2.FRAME_KIND_FULL
        kinds = []
        for n in range(MAX_CHAIN_VERSIONS + 1):
            kinds.append(client.merge("big", patch(n)).frame_kind)
            state += patch(n)
        # The chain the REPLACE started (version 2) holds MAX_CHAIN_VERSIONS versions: the next MERGE starts one.
        assert kinds.index(service_pb2.FRAME_KIND_FULL) == MAX_CHAIN_VERSIONS - 1
        assert client.get("big").state == state
        last = len(patch(MAX_CHAIN_VERSIONS)) + len(patch(MAX_CHAIN_VERSIONS - 1))
        assert client.get("big", version=1 + MAX_CHAIN_VERSIONS).state == state[:-last]


def test_a_put_streams_large_writes_commit_in_the_order_sent(sidecar: Sidecar) -> None:
    writes = [
        service_pb2.PutRequest(session_id="big", state=large_state(1), mode=service_pb2.WRITE_MODE_REPLACE),
        service_pb2.PutRequest(session_id="big", state=patch(1), mode=service_pb2.WRITE_MODE_MERGE),
        service_pb2.PutRequest(session_id="big", state=large_state(2), mode=service_pb2.WRITE_MODE_REPLACE),
        service_pb2.PutRequest(session_id="big", state=patch(2), mode=service_pb2.WRITE_MODE_MERGE),
        service_pb2.PutRequest(session_id="other", state=b"small", mode=service_pb2.WRITE_MODE_REPLACE),
    ]
    with CheckpointClient(sidecar.unix_target) as client:
        results = list(client.put_stream(writes, batch_size=2))
        assert [r.response.version for r in results] == [1, 2, 3, 4, 1]
        assert [client.get("big", version=v).state for v in (1, 2, 3, 4)] == [
            large_state(1),
            large_state(1) + patch(1),
            large_state(2),
            large_state(2) + patch(2),
        ]


def test_a_large_merge_chain_read_back_cold_after_a_restart_and_written_on(tmp_path: Path) -> None:
    """Segments (codec FORMAT.md §14) as a user meets them: a large state taking MERGEs through a real
    sidecar, stopped, started again, every version read cold, then more MERGEs. Folds are off, so the
    frames stay as the MERGEs wrote them (as after a crash, before the sweeper folds a quiet head)."""
    data = tmp_path / "data"
    states = [large_state(1)]
    no_folds = ("--fold-on-close-seconds", "0", "--fold-after-quiet-seconds", "0")
    sidecar = start_sidecar(data, *no_folds)
    with CheckpointClient(sidecar.unix_target) as client:
        client.put("big", states[0])
        for n in range(150):
            assert client.merge("big", patch(n)).frame_kind == service_pb2.FRAME_KIND_PATCH
            states.append(states[-1] + patch(n))
    assert sidecar.stop() == 0, sidecar.log()
    sidecar = start_sidecar(data, *no_folds)
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            for version, state in enumerate(states, 1):
                assert client.get("big", version=version).state == state, version
            for n in range(150, 200):  # an encoder resumed through the stored segments
                client.merge("big", patch(n))
                states.append(states[-1] + patch(n))
            assert [client.get("big", version=v).state for v in (160, 193, 201)] == [states[i] for i in (159, 192, 200)]
        # Beside the running sidecar.
        inspect = ckpt("inspect", "big", "--data-dir", str(data)).stdout.decode().splitlines()
        bases = {int(line.split()[0]): line.split()[3] for line in inspect[2:]}
        assert bases[9] == "1" and bases[65] == "1" and bases[73] == "65", inspect[:12]  # over 8, 64 and 8 versions
        verify = ckpt("verify", "--data-dir", str(data))
        assert verify.returncode == 0, verify.stdout + verify.stderr
    finally:
        assert sidecar.stop() == 0, sidecar.log()
