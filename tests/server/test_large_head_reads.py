"""Gets of large heads: the gRPC process reads them itself while the work is bounded (replycache.py).

A kept reader advances to a head of any size up to INLINE_ADVANCE_MAX_STATE_BYTES when the frames written
since output little; a chain is opened there when its decode outputs at most INLINE_READ_MAX_OUTPUT_BYTES;
anything more is forwarded to the store process. Each test drives a real `ckpt serve` and checks every Get
against a read-only Store on the same data directory.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckpt.sidecar.client import CheckpointClient
from ckpt.sidecar.server.replycache import INLINE_ADVANCE_MAX_STATE_BYTES, INLINE_READ_MAX_OUTPUT_BYTES
from ckpt.v1 import service_pb2
from tests.server.test_head_advance import EmbeddedHeads
from tests.support import Sidecar, metric, start_sidecar_with_metrics, wait_for_metrics

GETS = 'ckpt_requests_total{rpc="Get"}'
READ_HERE = 'ckpt_read_by_grpc_process_total{rpc="Get"}'
ADVANCED = "ckpt_reply_cache_advanced_reads_total"
HITS = "ckpt_reply_cache_hits_total"
_LETTERS = bytes(range(97, 123)) * 10 + b"          "  # 270 bytes: every byte value maps to one of them


def _text(seed: int, size: int) -> bytes:
    """About ``size`` bytes of fields 2 (a well-formed MERGE patch) of random words: zstd shrinks it ~2x."""
    letters = random.Random(seed).randbytes(size).translate(_LETTERS[:256])
    # Fields of 16,000 bytes: a two-byte length.
    pieces = [letters[i : i + 16_000] for i in range(0, len(letters), 16_000)]
    return b"".join(b"\x12" + bytes([(len(p) & 0x7F) | 0x80, len(p) >> 7]) + p for p in pieces)


def _count(sidecar: Sidecar, name: str) -> float:
    return metric(sidecar, name, missing=0.0)


def _counted(sidecar: Sidecar, gets: int, read_here: int, advanced: int, hits: int = 0) -> None:
    """Wait until the gRPC process reported ``gets`` Gets answered so (its reply cache's counts come at most
    a second later), else fail naming the counts."""
    names, expected = (GETS, READ_HERE, ADVANCED, HITS), [gets, read_here, advanced, hits]
    try:
        wait_for_metrics(lambda: [_count(sidecar, n) for n in names] == expected, timeout_seconds=10.0)
    except AssertionError:
        assert [_count(sidecar, n) for n in names] == expected
        raise


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    s = start_sidecar_with_metrics(tmp_path / "data")
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture
def embedded(sidecar: Sidecar) -> Iterator[EmbeddedHeads]:
    e = EmbeddedHeads(sidecar.data_dir)
    yield e
    e.store.close()


def test_a_head_grown_past_256_kib_is_read_by_advancing(sidecar: Sidecar, embedded: EmbeddedHeads) -> None:
    """A LangGraph thread's late checkpoints: a 300 KB state and MERGE appends to ~550 KB, each Get read by
    advancing the reader kept in the gRPC process, none forwarded to the store process."""
    with CheckpointClient(sidecar.unix_target) as client:
        client.put("thread", _text(1, 300_000))
        first = client.get("thread")  # its FULL frame decoded whole here: 300 KB of output
        embedded.check(first, "thread")
        assert first.info.frame_kind == service_pb2.FRAME_KIND_FULL
        for i in range(50):
            client.merge("thread", _text(100 + i, 5_000))
            got = client.get("thread")
            embedded.check(got, "thread")
        assert len(got.state) > 2 * 256 * 1024
    _counted(sidecar, gets=51, read_here=51, advanced=50)


def test_a_new_chain_is_opened_here_within_the_work_budget(sidecar: Sidecar, embedded: EmbeddedHeads) -> None:
    """A FULL frame and a few patches of a ~500 KB state: within INLINE_READ_MAX_OUTPUT_BYTES, decoded in the
    gRPC process; a FULL frame just past it is forwarded, and its reply kept for the next Get."""
    fits, over = _text(2, INLINE_READ_MAX_OUTPUT_BYTES - 40_000), _text(3, INLINE_READ_MAX_OUTPUT_BYTES + 8_000)
    with CheckpointClient(sidecar.unix_target) as client:
        client.put("fits", fits)
        for i in range(3):
            client.merge("fits", _text(10 + i, 5_000))
        client.put("over", over)
        embedded.check(client.get("fits"), "fits")
        _counted(sidecar, gets=1, read_here=1, advanced=0)
        embedded.check(client.get("over"), "over")  # forwarded
        _counted(sidecar, gets=2, read_here=1, advanced=0)
        embedded.check(client.get("over"), "over")  # the reply the store process sent, kept
        _counted(sidecar, gets=3, read_here=1, advanced=0, hits=1)
        client.merge("fits", _text(20, 5_000))
        embedded.check(client.get("fits"), "fits")  # its reader kept, advanced
        _counted(sidecar, gets=4, read_here=2, advanced=1, hits=1)


def test_too_much_work_is_forwarded_and_read_right(sidecar: Sidecar, embedded: EmbeddedHeads) -> None:
    """A patch outputting more than the budget, a head past INLINE_ADVANCE_MAX_STATE_BYTES and a 20 MB state
    are forwarded; every Get is still the store's head."""
    with CheckpointClient(sidecar.unix_target) as client:
        client.put("thread", _text(4, 300_000))
        embedded.check(client.get("thread"), "thread")  # read here
        client.merge("thread", _text(5, INLINE_READ_MAX_OUTPUT_BYTES + 8_000))
        embedded.check(client.get("thread"), "thread")  # the advance refused, the chain too: forwarded
        client.merge("thread", _text(6, 5_000))
        embedded.check(client.get("thread"), "thread")  # no reader kept, the chain over budget: forwarded
        _counted(sidecar, gets=3, read_here=1, advanced=0)
        # Grown by patches within the budget, up to and past the largest state a reader advances to.
        client.put("growing", _text(7, 300_000))
        embedded.check(client.get("growing"), "growing")
        gets, read_here, advanced, seed = 4, 2, 0, 100
        while True:
            client.merge("growing", _text(seed, INLINE_READ_MAX_OUTPUT_BYTES // 2))
            got = client.get("growing")
            embedded.check(got, "growing")
            gets, seed = gets + 1, seed + 1
            if got.info.frame_kind == service_pb2.FRAME_KIND_FULL or len(got.state) > INLINE_ADVANCE_MAX_STATE_BYTES:
                break
            read_here, advanced = read_here + 1, advanced + 1
        _counted(sidecar, gets=gets, read_here=read_here, advanced=advanced)
        # Twenty megabytes: forwarded (and its reply kept, then the next one after a MERGE forwarded too).
        huge = _text(8, 20_000_000)
        client.put("huge", huge)
        for _ in range(2):
            got = client.get("huge")
            assert got.state == huge
            embedded.check(got, "huge")
        client.merge("huge", _text(9, 5_000))
        embedded.check(client.get("huge"), "huge")
        _counted(sidecar, gets=gets + 3, read_here=read_here, advanced=advanced, hits=1)
