"""The open event block: appends onto its cached zstd stream and tail, checked against storage before use.

Each test drives a real Store on a real LMDB directory; another process's
appends come from a child process opening the same directory as a
``--workers`` sibling does (a shared Store).
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest
import xxhash

from ckpt.sidecar import DataLoss, EventQuery, NewEvent, Retention, Store, StoreConfig
from ckpt.sidecar.store.dirlock import lock_data_dir
from ckpt.sidecar.store.eventblocks import block_key
from ckpt.sidecar.store.events import FRAME_OPEN, HEADER_BYTES, TAIL, block_header
from ckpt.sidecar.store.eventstream import TAIL_FOLD_BYTES, TAIL_MAX_BYTES, value_pages
from ckpt.sidecar.store.ops import Op
from ckpt.sidecar.tools.crosscheck import CrossCheck
from tests.support import ckpt

SECOND = 1_000_000_000
ROOT = Path(__file__).resolve().parents[2]


def payload(i: int) -> bytes:
    # JSON-like and a few hundred bytes: some compress against earlier events, some not.
    return b'{"role": "tool", "step": %d, "text": "%s"}' % (i, (b"result %d " % (i * 7919 % 1000)) * (i % 40))


def every(store: Store, session: str, **query: object) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    token = ""
    while True:
        page = store.read_events(session, EventQuery(page_token=token, **query))  # type: ignore[arg-type]
        out += [(e.seq, e.payload) for e in page.events]
        token = page.next_page_token
        if not token:
            return out


def values(store: Store, session: bytes) -> list[tuple[int, int]]:
    """The session's stored values: (first seq, flags) each."""
    assert store.tables.events is not None
    with store.read() as txn:
        out = []
        for key, value in txn.scan(store.tables.events, session + b"\0"):
            if not bytes(key).startswith(session + b"\0"):
                break
            out.append((block_header(value, "").first_seq, value[3]))
        return out


def problems(store: Store) -> list[str]:
    with store.read() as txn:
        return [p.text for p in CrossCheck(store, txn, None).run("events")]


def check_reads(store: Store, session: str, expected: list[tuple[int, bytes]]) -> None:
    assert every(store, session) == expected
    assert every(store, session, newest_first=True, page_size=7) == expected[::-1]
    for i in (0, len(expected) // 2, len(expected) - 1):
        assert every(store, session, after_seq=expected[i][0] - 1, page_size=3) == expected[i:]
    last = store.read_events(session, EventQuery(newest_first=True, page_size=50)).events
    assert [(e.seq, e.payload) for e in last] == expected[::-1][:50]


@pytest.fixture
def config(tmp_path: Path) -> StoreConfig:
    return StoreConfig(data_dir=tmp_path / "data", sweep_interval_seconds=3600)


def test_one_event_appends_go_to_a_tail_that_folds_into_the_block(config: StoreConfig) -> None:
    expected = []
    with Store(config) as store:
        shapes = set()
        for i in range(1, 400):  # past SEAL_EVENTS: seals a block and opens another
            assert store.append_events("s", [NewEvent("step", payload(i))]).first_seq == i
            expected.append((i, payload(i)))
            shapes.add(tuple(flags for _, flags in values(store, b"s")[-2:]))
        # The open block alone (just folded), or with its tail; sealed blocks before it.
        assert {(FRAME_OPEN,), (FRAME_OPEN, FRAME_OPEN | TAIL), (0, FRAME_OPEN)} <= shapes
        assert store._events.streams.hits >= 380  # the stream continued: no block read back
        check_reads(store, "s", expected)
        assert problems(store) == []
    with Store(config) as store:  # a new process: no stream cached; the block is read back
        store.append_events("s", [NewEvent("step", payload(400))])
        expected.append((400, payload(400)))
        check_reads(store, "s", expected)
        assert problems(store) == []
    assert ckpt("verify", "--data-dir", str(config.data_dir)).returncode == 0


def test_a_tail_grows_past_its_fold_size_only_where_a_fold_would_take_the_block_onto_another_page(
    config: StoreConfig,
) -> None:
    """Once a block's value has pages of its own, a fold that would begin one more page waits: the tail
    grows on its leaf page instead, up to TAIL_MAX_BYTES, so that folds fill the value's pages first."""
    rng = random.Random(3)
    expected = []
    grown = 0
    before: tuple[bytes, int] = (b"", 0)  # the block's value and its tail's frame bytes after the last append
    with Store(config) as store:
        assert store.tables.events is not None
        for i in range(1, 150):  # ~30 KB of events: one open block, never sealed
            text = bytes(rng.choice(b"abcdefghij ") for _ in range(rng.randint(100, 300)))
            store.append_events("s", [NewEvent("step", text)])
            expected.append((i, text))
            with store.read() as txn:
                stored = [bytes(v) for _, v in txn.scan(store.tables.events, b"s\0")]
            assert len(stored) <= 2 and stored[0][3] == FRAME_OPEN
            block, tail = stored[0], (stored[1] if len(stored) > 1 else b"")
            tail_frame = max(len(tail) - HEADER_BYTES - 16, 0)  # its header, the block's XXH3 and its own
            if before[1] >= TAIL_FOLD_BYTES and block == before[0]:  # a tail of its fold size grew instead
                grown += 1
                assert before[1] < TAIL_MAX_BYTES
                assert value_pages(len(block) + before[1]) > value_pages(len(block))
            before = (block, tail_frame)
        assert grown >= 5  # the rule was met, not only the 256-byte fold
        check_reads(store, "s", expected)
        assert problems(store) == []


def test_a_cached_stream_knows_the_headers_of_the_values_it_wrote(config: StoreConfig) -> None:
    # An append takes the open block's header (and its tail's) from the stream that wrote them instead of
    # checking and parsing the stored values again: they must be the headers those values hold.
    rng = random.Random(7)
    seq = 0
    with Store(config) as store:
        for _ in range(300):  # past SEAL_EVENTS: folds, recompressions, seals and new blocks
            batch = [NewEvent("step", payload(rng.randrange(1, 500))) for _ in range(rng.choice((1, 1, 1, 3, 9)))]
            seq = store.append_events("s", batch).last_seq
            stored = {block_header(v, "").first_seq: v for v in raw_values(store, b"s")}
            open_seq = max(s for s, v in stored.items() if not v[3] & TAIL)
            value = stored[open_seq]
            if not value[3] & FRAME_OPEN:
                continue  # just sealed: no stream is kept for a sealed block
            stream = store._events.streams.written(b"s", value)
            assert stream is not None
            assert stream.header == block_header(value, "")
            tail = stored.get(stream.header.last_seq + 1)
            assert (stream.tail is None) == (tail is None)
            if tail is not None:
                assert stream.tail_value == tail
                assert stream.tail == block_header(tail, "")
        check_reads(store, "s", [(e.seq, e.payload) for e in store.read_events("s", EventQuery(page_size=1000)).events])
        assert seq > 600
        assert problems(store) == []


def raw_values(store: Store, session: bytes) -> list[bytes]:
    assert store.tables.events is not None
    with store.read() as txn:
        return [
            bytes(value)
            for key, value in txn.scan(store.tables.events, session + b"\0")
            if bytes(key).startswith(session + b"\0")
        ]


_APPEND_CHILD = """
import random
import sys
from pathlib import Path
from ckpt.sidecar.config import StoreConfig
from ckpt.sidecar.store.engine import Store
from ckpt.sidecar.store.types import NewEvent
store = Store(StoreConfig(data_dir=Path(sys.argv[1]), sweep_interval_seconds=3600), shared=True, sweeper=False)
for i in range(int(sys.argv[2]), int(sys.argv[3])):
    store.append_events("s", [NewEvent("child", b"%d " % i + random.Random(i).randbytes(40))])
store.close()
"""


def test_another_process_appending_between_two_appends_is_noticed(config: StoreConfig) -> None:
    config.data_dir.mkdir()
    lock = lock_data_dir(config.data_dir)  # as the workers' parent holds it
    expected: list[tuple[int, bytes]] = []
    try:
        with Store(config, shared=True, sweeper=False) as store:
            seq = 0
            # The child's appends fold the block (it has no stream), then fill a tail, then outgrow one.
            for child_events in (1, 3, 40):
                for _ in range(5):
                    seq += 1
                    assert store.append_events("s", [NewEvent("here", payload(seq))]).first_seq == seq
                    expected.append((seq, payload(seq)))
                misses = store._events.streams.misses
                child = subprocess.run(
                    [
                        sys.executable,
                        "-c",
                        _APPEND_CHILD,
                        str(config.data_dir),
                        str(seq + 1),
                        str(seq + 1 + child_events),
                    ],
                    capture_output=True,
                    text=True,
                    timeout=120,
                    cwd=ROOT,
                )
                assert child.returncode == 0, child.stderr
                expected += [
                    (s, b"%d " % s + random.Random(s).randbytes(40)) for s in range(seq + 1, seq + 1 + child_events)
                ]
                seq += child_events
                # This process's stream last wrote a block the other process has since changed: not used.
                seq += 1
                assert store.append_events("s", [NewEvent("here", payload(seq))]).first_seq == seq
                expected.append((seq, payload(seq)))
                assert store._events.streams.misses == misses + 1
                check_reads(store, "s", expected)
                assert problems(store) == []
    finally:
        lock.close()


def test_an_append_undone_after_writing_leaves_the_stream_unused(config: StoreConfig) -> None:
    with Store(config) as store:
        expected = []
        for i in range(1, 4):
            store.append_events("s", [NewEvent("step", payload(i))])
            expected.append((i, payload(i)))
        append = store._append_op("s", [NewEvent("undone", b"never committed")], None, "", defer_check=False)

        def apply_then_fail(batch: object, txn: object) -> None:
            append.apply(batch, txn)  # type: ignore[arg-type]
            raise RuntimeError("the op fails after the append wrote: its nested transaction is undone")

        with pytest.raises(RuntimeError, match="undone"):
            store._writer.submit(Op(apply_then_fail)).wait()
        # The cached stream holds the undone append; storage does not: the next append reads the block back.
        assert store.append_events("s", [NewEvent("step", payload(4))]).first_seq == 4
        expected.append((4, payload(4)))
        check_reads(store, "s", expected)
        assert problems(store) == []


def test_retention_and_forks_through_an_open_block_with_a_tail(tmp_path: Path) -> None:
    config = StoreConfig(
        data_dir=tmp_path / "data", retention=Retention(keep_last_events=5), sweep_interval_seconds=3600
    )
    with Store(config) as store:
        for i in range(1, 9):
            store.append_events("s", [NewEvent("step", payload(i), time_unix_nanos=i * SECOND)])
        assert [flags for _, flags in values(store, b"s")] == [FRAME_OPEN, FRAME_OPEN | TAIL]
        store.put("s", b"state")
        store.fork("s", 0, "copy", copy_events=True)
        assert store.sweep(now_nanos=100 * SECOND).events_removed == 3 + 3  # both logs cut to the last 5
        for session in ("s", "copy"):
            store.append_events(session, [NewEvent("step", payload(9), time_unix_nanos=9 * SECOND)])
            check_reads(store, session, [(i, payload(i)) for i in range(4, 10)])
        assert problems(store) == []
    assert ckpt("verify", "--data-dir", str(config.data_dir)).returncode == 0


@pytest.mark.parametrize("damage", ["flip-frame", "rename-base", "cut", "remove-block", "remove-tail"])
def test_a_damaged_tail_or_its_block_is_data_loss_naming_the_seq(config: StoreConfig, damage: str) -> None:
    with Store(config) as store:
        for i in range(1, 5):
            store.append_events("s", [NewEvent("step", payload(i))])
        assert [flags for _, flags in values(store, b"s")] == [FRAME_OPEN, FRAME_OPEN | TAIL]
    env = lmdb.open(str(config.data_dir / "lmdb"), max_dbs=16)
    with env.begin(write=True) as txn:
        db = env.open_db(b"events", txn=txn)
        found = txn.get(block_key(b"s", 2), db=db)
        assert found is not None
        value = bytearray(found)
        if damage == "flip-frame":
            value[-12] ^= 0x01
        elif damage == "rename-base":  # names another block's XXH3-64 (after the 36-byte header), checksummed anew
            value[38] ^= 0x01
            value[-8:] = xxhash.xxh3_64_intdigest(bytes(value[:-8])).to_bytes(8, "little")
        elif damage == "cut":
            value = value[:-5]
        if damage == "remove-block":
            txn.delete(block_key(b"s", 1), db=db)
        elif damage == "remove-tail":
            txn.delete(block_key(b"s", 2), db=db)
        else:
            txn.put(block_key(b"s", 2), bytes(value), db=db)
    env.close()
    with Store(config) as store:
        with pytest.raises(DataLoss, match=r"session 's' event seq [12]: "):
            every(store, "s", newest_first=True)
        with pytest.raises(DataLoss, match=r"session 's' event seq [12]: "):
            every(store, "s")
        with pytest.raises(DataLoss, match=r"session 's' event seq [12]: "):
            store.append_events("s", [NewEvent("step", b"more")])
        assert problems(store)
    verify = ckpt("verify", "--data-dir", str(config.data_dir))
    assert verify.returncode == 1
    assert "FAIL session 's': events table: event seq " in verify.stderr.decode()
