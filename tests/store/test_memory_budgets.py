"""Memory stays within the configured budgets over many sessions.

The state cache weighs what each entry keeps, not only its state's bytes
(tiny or empty states must not let it keep every session ever written); a
group commit keeps no more encoders (head state and zstd stream) alive until
the commit than encoder_cache_bytes allows.
"""

from __future__ import annotations

import gc
import time
import tracemalloc
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
from google.protobuf.message import Message

from ckpt.codec import ChainEncoder, ChainPolicy, FrameKind, StateSnapshot
from ckpt.sidecar import Store, StoreConfig
from ckpt.sidecar.client import CheckpointClient
from ckpt.sidecar.store import PutRequest, PutResult, VersionInfo, WriteMode
from ckpt.sidecar.store.cache import StateCache
from ckpt.v1 import service_pb2
from tests.store.support import wait_queued, writer_held
from tests.support import start_sidecar


@pytest.fixture
def config(tmp_path: Path) -> StoreConfig:
    return StoreConfig(data_dir=tmp_path / "data", chain_policy=ChainPolicy(max_depth=8), sweep_interval_seconds=3600)


def _info(version: int, labels: dict[str, str]) -> VersionInfo:
    return VersionInfo(
        version=version,
        parent_version=version - 1,
        created_unix_nanos=time.time_ns(),
        frame_kind=FrameKind.FULL,
        stored_bytes=40,
        state_size=0,
        labels=labels,
        mode=WriteMode.REPLACE,
    )


@pytest.mark.parametrize("labels", [0, 8])
def test_state_cache_weight_covers_what_each_entry_keeps(labels: int) -> None:
    # 20,000 sessions of empty states (a MERGE session's first empty patch, a
    # placeholder state): a 64 KiB cache must not keep 20,000 entries.
    budget = 64 * 1024
    cache = StateCache(budget)
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(20_000):
            # New strings per entry, as each request's labels are.
            entry_labels = {f"key-{k}": f"value-{i}-{k}" * 4 for k in range(labels)}
            cache.put(f"session-{i:08d}".encode(), StateSnapshot([b""], 1, 0), _info(i + 1, entry_labels))
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert cache.size_bytes <= budget
    # What the cache says it holds is about what it keeps (its weights are estimates).
    assert grown <= 1.5 * budget, (grown, len(cache))
    assert cache.size_bytes >= 0.5 * grown, (cache.size_bytes, grown)


def test_store_state_cache_of_empty_states_is_bounded(config: StoreConfig) -> None:
    budget = 64 * 1024
    with Store(replace(config, cache_size_bytes=budget, encoder_cache_entries=0)) as store:
        for start in range(0, 5000, 500):
            store.put_many([PutRequest(f"s-{i}", b"") for i in range(start, start + 500)])
        assert store.counters.memory_bytes["state_cache"] <= budget
        cached = sum(store.get_cached(f"s-{i}") is not None for i in range(5000))
        assert cached <= budget // 600, cached  # ~100 entries, not 5,000
        assert store.get("s-0").state == b"" and store.get("s-4999").state == b""


def test_a_group_commit_keeps_no_more_encoders_than_the_budget(config: StoreConfig) -> None:
    # 200 writes of 20 KB states to new sessions in one group commit, with
    # room for about two encoders: the encoders alive when the batch commits
    # are what the cache keeps plus at most its budget again, not all 200.
    state = bytes(range(256)) * 80
    probe = ChainEncoder(policy=config.chain_policy)
    probe.replace(state)
    budget = int(2.5 * probe.memory_bytes)
    live: weakref.WeakSet[ChainEncoder] = weakref.WeakSet()
    at_commit: list[int] = []
    with Store(replace(config, encoder_cache_bytes=budget, cache_size_bytes=0)) as store:
        # A private hook: which encoders are alive when a batch commits shows only at the encoder cache.
        encoders = store._encoders
        new_encoder, after_write = encoders.new, encoders.after_write

        def tracked(compact: type[Message] | None = None) -> ChainEncoder:
            encoder = new_encoder(compact)
            live.add(encoder)
            return encoder

        def first_after_write(sid: bytes, encoder: ChainEncoder | None, head: StateSnapshot, info: VersionInfo) -> None:
            if not at_commit:
                gc.collect()
                at_commit.append(sum(e.memory_bytes for e in live))
            after_write(sid, encoder, head, info)

        encoders.new = tracked  # type: ignore[method-assign]
        encoders.after_write = first_after_write  # type: ignore[method-assign]
        # Hold the writer so that all 200 writes are queued, and committed, together.
        with writer_held(store), ThreadPoolExecutor(1) as pool:
            writing = pool.submit(store.put_many, [PutRequest(f"big-{i}", state) for i in range(200)])
            wait_queued(store, 200)
        for result in writing.result(30):
            assert isinstance(result, PutResult) and result.frame_kind is FrameKind.FULL
        assert store.counters.batch_sizes[200] == 1
        assert at_commit[0] <= 2 * budget, (at_commit[0], budget)
        assert store.counters.memory_bytes["encoder_cache"] <= budget
        assert store.get("big-0").state == state and store.get("big-199").state == state
        # A dropped encoder is rebuilt from LMDB at the session's next write.
        assert store.put("big-0", state + b"more").version == 2
        assert store.get("big-0", 1).state == state


def _peak_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_sidecar_memory_stays_near_its_budgets_under_large_states(tmp_path: Path) -> None:
    # A real `ckpt serve` with 8 MiB for states and 16 MiB for encoders, fed
    # 384 writes of 300 KB states on one stream: its peak memory must stay
    # near the budgets plus the writes in flight, not grow by an encoder
    # (~2-3 MiB here) per write of a group commit (~1.1 GiB before).
    mib = 1 << 20
    sidecar = start_sidecar(
        tmp_path / "data",
        "--cache-size-bytes",
        str(8 * mib),
        "--encoder-cache-bytes",
        str(16 * mib),
        "--durability",
        "no-meta-sync",
    )
    try:
        text = b" ".join(b"word%d" % (i * 7919 % 5003) for i in range(60_000))[:300_000]
        with CheckpointClient(sidecar.unix_target, timeout_seconds=60) as client:
            puts = (
                service_pb2.PutRequest(session_id=f"big-{i}", state=text[i:] + text[:i], request_id=f"r{i}")
                for i in range(384)
            )
            results = list(client.put_stream(puts, batch_size=64))
            assert all(not r.HasField("error") for r in results) and len(results) == 384
            assert client.get("big-383").state == text[383:] + text[:383]
        peak = _peak_rss_bytes(sidecar.pid)
    finally:
        assert sidecar.stop() == 0
    # The writes themselves (384 x 300 KB, ~110 MiB) may all be in flight at once.
    assert peak < 400 * mib, f"peak RSS {peak / mib:.0f} MiB"


def test_an_encoder_kept_between_writes_holds_one_state(config: StoreConfig) -> None:
    """A REPLACE kept the previous state for a rollback until the session's next write:
    each cached encoder held two states while counting one."""
    size = 300_000
    with Store(config) as store:
        store.put("s", bytes(size))
        one_write = store.counters.memory_bytes["encoder_cache"]
        for v in range(1, 6):
            store.put("s", bytes([v]) * size)
            assert store.counters.memory_bytes["encoder_cache"] == one_write
