"""Event blocks of format 1 (every block one ended zstd frame, no flags) read, appended to and verified.

A store is written by this build, then every session's blocks and tails are
rewritten as format 1 stored them: one value per block, its whole body one
ended frame, the format byte 1 and the flags byte 0.
"""

from __future__ import annotations

import struct
from pathlib import Path

import lmdb
import xxhash

from ckpt.sidecar import EventQuery, NewEvent, Store, StoreConfig
from ckpt.sidecar.store.eventblocks import block_key, stored_blocks
from ckpt.sidecar.store.events import block_raw, encode_block
from ckpt.store.v1 import records_pb2
from tests.support import ckpt


def as_format1(data_dir: Path, sid: bytes) -> int:
    """Rewrite ``sid``'s event values as format 1; the number of blocks written."""
    env = lmdb.open(str(data_dir / "lmdb"), max_dbs=16)
    try:
        events = env.open_db(b"events")
        with env.begin(write=True) as txn:
            cursor = txn.cursor(events)
            start = sid + b"\0"
            found = []
            if cursor.set_range(start):
                for key, value in cursor:
                    if not key.startswith(start):
                        break
                    found.append((key, value))
            blocks = list(stored_blocks(sid, iter(found)))
            for key, _ in found:
                txn.delete(key, db=events)
            stored = 0
            for block in blocks:
                h = block.header
                raw = block_raw(block.value, h, "", block.tail)
                sealed = bytearray(encode_block(raw, h.first_seq, h.count, h.min_time_nanos, h.max_time_nanos))
                sealed[2] = 1  # format 1
                assert sealed[3] == 0  # no flags
                body = bytes(sealed[:-8])
                stored += len(body) + 8
                txn.put(
                    block_key(sid, h.first_seq), body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body)), db=events
                )
            logs = env.open_db(b"event_logs", txn=txn)
            log = records_pb2.EventLogRecord.FromString(bytes(txn.get(sid, db=logs) or b""))
            log.stored_bytes = stored
            txn.put(sid, log.SerializeToString(), db=logs)
        return len(blocks)
    finally:
        env.close()


def test_a_log_of_format1_blocks_is_read_appended_to_and_verified(tmp_path: Path) -> None:
    config = StoreConfig(data_dir=tmp_path / "data")
    payloads = [b'{"step": %d, "text": "%s"}' % (i, b"x" * (i % 50)) for i in range(300)]  # past one block
    with Store(config) as store:
        store.put("chat", b"state")
        for i in range(0, 300, 3):
            store.append_events("chat", [NewEvent(type="msg", payload=p) for p in payloads[i : i + 3]])
    assert as_format1(config.data_dir, b"chat") == 2
    with Store(config) as store:
        got = store.read_events("chat", EventQuery(page_size=1000)).events
        assert [e.payload for e in got] == payloads
        assert [e.seq for e in got] == list(range(1, 301))
        appended = store.append_events("chat", [NewEvent(type="msg", payload=b"after")])
        assert (appended.first_seq, appended.last_seq) == (301, 301)
        newest = store.read_events("chat", EventQuery(newest_first=True, page_size=2)).events
        assert [(e.seq, e.payload) for e in newest] == [(301, b"after"), (300, payloads[299])]
        store.fork("chat", 0, "copy", copy_events=True)
        assert [e.payload for e in store.read_events("copy", EventQuery(page_size=1000)).events] == [
            *payloads,
            b"after",
        ]
    done = ckpt("verify", "--data-dir", str(config.data_dir))
    assert done.returncode == 0, done.stdout + done.stderr
