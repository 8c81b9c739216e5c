"""The store under faults: callers that give up, bugs mid-batch, damaged sessions, backlogs."""

from __future__ import annotations

import asyncio
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import lmdb
import pytest

from ckpt.codec import ChainPolicy, FrameKind, frame_kind
from ckpt.sidecar import DataLoss, InvalidArgument, PutRequest, Retention, Store, StoreConfig, Unavailable, WriteMode
from ckpt.sidecar.client import CheckpointClient
from ckpt.sidecar.storage import StorageFailure
from ckpt.sidecar.store import requestids
from ckpt.sidecar.store.encoders import Encoders
from ckpt.store.v1 import records_pb2
from tests.store.support import put_request, state_of, storage_of, storage_write_lock_held
from tests.support import ROOT, ckpt, start_sidecar

CHAINS = ChainPolicy(frame_cost_bytes=0, max_depth=3)


@pytest.fixture
def config(tmp_path: Path) -> StoreConfig:
    return StoreConfig(data_dir=tmp_path / "data", chain_policy=CHAINS, sweep_interval_seconds=3600)


@pytest.fixture
def store(config: StoreConfig) -> Iterator[Store]:
    with Store(config) as s:
        yield s


def put_answers_within(store: Store, session: str, seconds: float = 10.0) -> bool:
    """Whether a put is answered in time (a dead writer would leave it waiting forever)."""
    done = threading.Event()

    def put() -> None:
        store.put(session, state_of(session, 1))
        done.set()

    threading.Thread(target=put, daemon=True).start()
    return done.wait(seconds)


def test_a_timed_out_wait_on_a_submitted_write_leaves_the_writer_serving(store: Store) -> None:
    async def give_up() -> None:
        # The storage's write lock, held here, keeps the writes queued while their callers give up.
        with storage_write_lock_held(store):
            waits = [store.asubmit(PutRequest("to", state_of("to", v))) for v in range(1, 50)]
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.gather(*waits), timeout=0.05)

    asyncio.run(give_up())
    assert put_answers_within(store, "after")
    assert store.session("to").head_version == 49  # every write the caller stopped waiting for committed


def test_an_error_outside_any_write_fails_the_batch_and_the_writer_goes_on(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.put("bug", state_of("bug", 1))
    real = Encoders.after_write
    calls = 0

    # A private hook: a bug between a commit and its answers cannot be caused through the store's API.
    def after_write_failing_once(self: Encoders, *args: object) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("injected bug after commit")
        real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Encoders, "after_write", after_write_failing_once)
    with pytest.raises(Unavailable, match=r"may not have been committed .*injected bug"):
        store.put("bug", state_of("bug", 2))
    assert store._writer.queued_bytes == 0  # its bytes stopped counting against max_queued_write_bytes
    # It did commit; the caches were dropped, so reads and the next write go to LMDB.
    assert store.get("bug").state == state_of("bug", 2)
    assert store.put("bug", state_of("bug", 3)).version == 3
    assert store.get("bug").state == state_of("bug", 3)
    assert put_answers_within(store, "after")


def break_every_chain_start(data_dir: Path, session: str) -> None:
    """Rewrite the kind byte of a session's FULL frames, so no chain has a start."""
    env = lmdb.open(str(data_dir / "lmdb"), max_dbs=8)
    frames = env.open_db(b"frames")
    with env.begin(write=True, db=frames) as txn:
        cur = txn.cursor()
        prefix = session.encode() + b"\x00"
        cur.set_range(prefix)
        for key, value in list(cur.iternext()):
            if not key.startswith(prefix):
                break
            raw = bytearray(value)
            frame_at = 2 + struct.unpack_from("<H", raw)[0]
            if frame_kind(raw[frame_at:]) is FrameKind.FULL:
                raw[frame_at + 3] ^= FrameKind.FULL ^ FrameKind.DELTA  # the kind bits of a format 2 frame (FORMAT.md)
                assert frame_kind(raw[frame_at:]) is FrameKind.DELTA
                txn.put(key, bytes(raw))
    env.close()


def test_a_damaged_session_does_not_stop_retention_or_request_id_expiry(config: StoreConfig) -> None:
    cfg = replace(config, retention=Retention(keep_last_versions=2), request_id_ttl_seconds=1)
    with Store(cfg) as store:
        for v in range(1, 13):
            store.put("bad", state_of("bad", v))
            store.put("good", state_of("good", v), request_id=f"r{v}")
    break_every_chain_start(cfg.data_dir, "bad")
    with Store(cfg) as store:
        result = store.sweep(now_nanos=time.time_ns() + 10**9 * 3600)
        assert result.request_ids_expired == 12
        assert (result.sessions_pruned, store.session("good").first_version) == (1, 9)  # chains: 1, 5, 9
        assert store.session("bad").version_count == 12  # kept as it is, for verify to name
        assert store.get("good").state == state_of("good", 12)


def test_the_background_sweeper_outlives_a_failed_sweep(config: StoreConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    rounds = 0

    def failing_sweep(self: Store, **kwargs: object) -> None:
        nonlocal rounds
        rounds += 1
        raise RuntimeError("injected sweep failure")

    monkeypatch.setattr(Store, "sweep", failing_sweep)
    with Store(replace(config, sweep_interval_seconds=0.01)):
        deadline = time.monotonic() + 10
        while rounds < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert rounds >= 3


def test_a_backlog_of_expired_request_ids_goes_in_chunks(config: StoreConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(requestids, "EXPIRE_CHUNK", 7)  # a private hook: the chunk is a constant of the module
    with Store(replace(config, request_id_ttl_seconds=1)) as store:
        for v in range(1, 31):
            store.put("rid", state_of("rid", v), request_id=f"r{v}")
        commits = store.counters.commits
        assert store.sweep(now_nanos=time.time_ns() + 10**10).request_ids_expired == 30
        # 7 + 7 + 7 + 7 + 2, each its own write op; then the time the sweep began, kept for a restart
        assert store.counters.commits - commits == 6
        assert store.put("rid", state_of("rid", 1), request_id="r1").version == 31  # expired: a new write


def test_an_expiry_entry_left_behind_does_not_expire_a_newer_record_of_the_same_request_id(
    config: StoreConfig,
) -> None:
    """A request record that does not parse, of a session since deleted: the write made again replaces
    it, and its expiry entry (whose time only the record held) is left. Expiring that entry used to
    delete whatever record held the key by then: here the record of the same request id written after
    the session was made again, so a retry of that write, still within its own TTL, wrote a second
    version instead of replaying. (Store layout 1 deleted such a record with its session, leaving the
    entry the same way.)"""
    with Store(config) as store:
        store.put("s", state_of("s", 1), request_id="step-1")
    env = lmdb.open(str(config.data_dir / "lmdb"), max_dbs=8)
    requests, expiry = env.open_db(b"requests"), env.open_db(b"req_expiry")
    with env.begin(write=True) as txn:
        ((rid_key, _),) = list(txn.cursor(db=requests))
        ((old_entry, _),) = list(txn.cursor(db=expiry))
        txn.put(rid_key, b"\xff\xff not a record", db=requests)
    env.close()
    old_expiry = struct.unpack(">Q", old_entry[:8])[0]
    with Store(config) as store:
        assert store.delete_session("s") == 1
        first = store.put("s", state_of("s", 1), request_id="step-1")  # the agent starts over
        assert store.sweep(now_nanos=old_expiry + 1).request_ids_expired == 1  # the entry left behind
        retry = store.put("s", state_of("s", 1), request_id="step-1")
        assert (retry.version, retry.replayed) == (first.version, True)
        assert store.session("s").version_count == 1
    assert ckpt("verify", "--data-dir", str(config.data_dir)).returncode == 0


def test_a_read_that_waited_for_the_lock_while_the_store_closed_is_unavailable(store: Store) -> None:
    # A reader past close()'s first check, waiting for the lock while close() closed LMDB, then
    # began a transaction on the closed environment: a bare lmdb.Error, not Unavailable.
    store.put("s", state_of("s", 1))
    outcome: list[BaseException | bytes] = []

    def read() -> None:
        try:
            outcome.append(store.get("s", use_cache=False).state)
        except BaseException as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read)
    # A private hook: the LMDB storage's resize lock, held as its close() holds it, so that the read
    # waits for it exactly while LMDB closes (no public call stops a read there).
    storage = storage_of(store)
    with storage._rw.exclusive():
        reader.start()
        time.sleep(0.2)  # the reader waits for the lock
        storage.env.close()
        storage._closed = True
    reader.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], Unavailable), outcome
    assert str(outcome[0]) == "the store is closed"


def test_a_data_dir_that_is_a_file_is_named_as_such(config: StoreConfig) -> None:
    config.data_dir.write_text("")
    with pytest.raises(NotADirectoryError, match=r"the data directory is not a directory: '.*data'"):
        Store(config)


def test_a_store_that_fails_to_open_releases_its_directory(config: StoreConfig) -> None:
    config.data_dir.mkdir(parents=True)
    (config.data_dir / "lmdb").write_text("not a directory")  # LMDB cannot open here
    with pytest.raises(StorageFailure, match=r"lmdb/data.mdb cannot be opened as an LMDB database: "):
        Store(config)
    (config.data_dir / "lmdb").unlink()
    with Store(config) as store:  # not "in use by" the failed attempt
        assert store.put("s", b"\x08\x01").version == 1


def test_the_longest_labels_on_the_longest_session_id_are_stored_and_indexed(store: Store) -> None:
    sid = "s" * 256
    labels = {f"{i:02d}" + "k" * 61: "v" * 128 for i in range(64)}
    store.put(sid, b"\x08\x01", labels=labels)
    key, value = next(iter(labels.items()))
    assert [s.session_id for s in store.list_sessions(label_filter={key: value})[0]] == [sid]
    assert store.session(sid).labels == labels


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ({"k": "v" * 129}, "labels\\['k'\\] value is 129 bytes; the limit is 128"),
        ({"k" * 64: "v"}, "is 64 bytes; it must be 1-63"),
        ({"k\ud800": "v"}, "is not valid UTF-8"),
        ({"k": "v\udfff"}, "is not valid UTF-8"),
        ({"k\n": "v"}, "labels key 'k\\\\n' contains an ASCII control character"),
        (
            {"k": "v\x7f"},
            "labels\\['k'\\] value 'v\\\\x7f' contains an ASCII control character",
        ),  # the value, not the key
    ],
)
def test_labels_out_of_bounds_are_invalid_arguments(store: Store, labels: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        store.put("l", b"\x08\x01", labels=labels)
    with pytest.raises(InvalidArgument, match=message.replace("labels", "label_filter")):
        store.list_sessions(label_filter=labels)
    results = store.put_many([PutRequest("l", b"\x08\x01", labels=labels), PutRequest("l", b"\x08\x02")])
    assert [type(r).__name__ for r in results] == ["InvalidArgument", "PutResult"]


def test_a_session_holds_at_most_64_labels_over_all_its_writes(store: Store) -> None:
    store.put("many", b"\x08\x01", labels={f"a{i}": "1" for i in range(40)})
    store.put("many", b"\x08\x02", labels={f"b{i}": "1" for i in range(24)})
    with pytest.raises(InvalidArgument, match="has 64 labels; these labels would make it 65, over the limit of 64"):
        store.put("many", b"\x08\x03", labels={"c": "1"})
    assert store.put("many", b"\x08\x04", labels={"a0": "2", "b0": "2"}).version == 3  # new values, same keys
    assert len(store.session("many").labels) == 64
    assert store.session("many").head_version == 3  # the refused write wrote nothing


def test_a_time_filter_past_the_index_is_an_invalid_argument(store: Store) -> None:
    store.put("t", b"\x08\x01")
    with pytest.raises(InvalidArgument, match=rf"^updated_after_nanos must be in .*\.\.{2**64 - 1} .*, got {2**64}$"):
        store.list_sessions(updated_after_nanos=2**64)
    with pytest.raises(InvalidArgument, match=rf"^updated_before_nanos must be in .*\.\.{2**64 - 1} .*, got {2**64}$"):
        store.list_sessions(updated_before_nanos=2**64)
    assert [s.session_id for s in store.list_sessions(updated_before_nanos=2**64 - 1)[0]] == ["t"]


def rewrite_version_record(data_dir: Path, session: str, version: int, new_meta: bytes) -> None:
    env = lmdb.open(str(data_dir / "lmdb"), max_dbs=8)
    frames = env.open_db(b"frames")
    with env.begin(write=True, db=frames) as txn:
        key = session.encode() + b"\x00" + version.to_bytes(8, "big")
        value = txn.get(key)
        assert value is not None
        (n,) = struct.unpack_from("<H", value)
        txn.put(key, struct.pack("<H", len(new_meta)) + new_meta + value[2 + n :])
    env.close()


@pytest.mark.parametrize(
    ("meta", "why"),
    [
        (records_pb2.VersionRecord(mode=7).SerializeToString(), "7 is not a valid WriteMode"),
        (b"\xff\xff\xff", "Error parsing message"),
    ],
)
def test_corrupt_version_metadata_is_data_loss_naming_session_and_version(
    config: StoreConfig, meta: bytes, why: str, tmp_path: Path
) -> None:
    with Store(config) as store:
        for v in range(1, 4):
            store.put("m", state_of("m", v))
            store.put("ok", state_of("ok", v))
    rewrite_version_record(config.data_dir, "m", 2, meta)
    with Store(config) as store:
        with pytest.raises(DataLoss, match=f"session 'm' version 2: its stored metadata is corrupt: .*{why}"):
            store.list_versions("m")
        # The state is checked against its frame's checksum and served; the metadata is read when asked for.
        got = store.get("m", 2)
        assert got.state == state_of("m", 2)
        with pytest.raises(DataLoss, match=f"session 'm' version 2: its stored metadata is corrupt: .*{why}"):
            _ = got.info
        assert store.get("m", 3, use_cache=False).state == state_of("m", 3)  # the frames are intact
        _, frames = store.frames_of("m")
        assert [type(v).__name__ for _, v, _ in frames] == ["VersionInfo", "DataLoss", "VersionInfo"]
    # The tools report it and go on to every other session.
    verify = ckpt("verify", "--data-dir", str(config.data_dir))
    assert verify.returncode == 1 and b"Traceback" not in verify.stderr
    assert b"FAIL session 'm': session 'm' version 2: its stored metadata is corrupt" in verify.stderr
    assert b"verified 2 sessions: 1 ok, 1 failed" in verify.stdout
    inspect = ckpt("inspect", "m", "--data-dir", str(config.data_dir))
    assert inspect.returncode == 0 and b"       2 CORRUPT" in inspect.stdout and b"       3 DELTA" in inspect.stdout


def test_verify_beside_a_sidecar_that_is_writing_finds_nothing_wrong(tmp_path: Path) -> None:
    sidecar = start_sidecar(tmp_path / "data")
    stop = threading.Event()

    def write() -> None:
        with CheckpointClient(sidecar.unix_target) as c:
            n = 0
            while not stop.is_set():
                n += 1
                c.merge(f"live{n % 4}", bytes([0x10, n % 128]))

    writer = threading.Thread(target=write)
    writer.start()
    try:
        time.sleep(0.3)
        runs = [ckpt("verify", "--data-dir", str(sidecar.data_dir)) for _ in range(6)]
    finally:
        stop.set()
        writer.join()
        assert sidecar.stop() == 0
    assert [r.returncode for r in runs] == [0] * 6, [r.stderr for r in runs if r.returncode]


GROW_IN_ANOTHER_PROCESS = """
import os
import sys
from pathlib import Path
from ckpt.sidecar import Store, StoreConfig
config = StoreConfig(data_dir=Path(sys.argv[1]), map_size_bytes=1 << 20, max_map_size_bytes=256 << 20)
with Store(config) as store:
    for i in range(400):
        store.put(f"grow{i}", os.urandom(40_000))
    print(store.counters.map_resizes)
"""


def test_a_read_only_store_reads_on_after_another_process_grows_the_map(config: StoreConfig) -> None:
    small = replace(config, map_size_bytes=1 << 20, max_map_size_bytes=256 << 20)
    with Store(small) as store:
        store.put("first", b"\x08\x01")
    with Store(small, readonly=True) as reader:  # maps the 1 MiB the file has now
        assert list(reader.session_ids()) == ["first"]
        grown = subprocess.run(
            [sys.executable, "-c", GROW_IN_ANOTHER_PROCESS, str(config.data_dir)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert grown.returncode == 0, grown.stderr
        assert int(grown.stdout) >= 3  # 1 MiB -> 16 MiB at least
        ids = list(reader.session_ids())
        assert len(ids) == 401
        for sid in ids:  # reads nested in a listing, as `ckpt verify` does
            assert reader.get(sid).version == 1


@pytest.mark.parametrize(
    "other",
    [
        PutRequest("idem", b"\x08\x02", request_id="r1"),  # another state
        PutRequest("idem", b"\x08\x01", request_id="r1", labels={"k": "v"}),  # other labels
        PutRequest("idem", b"\x08\x01", request_id="r1", expected_version=0),  # another precondition
        PutRequest("idem", b"\x08\x01", request_id="r1", mode=WriteMode.MERGE),  # another mode
    ],
)
def test_a_request_id_reused_for_another_write_is_refused(store: Store, other: PutRequest) -> None:
    first = store.put("idem", b"\x08\x01", request_id="r1")
    assert store.put("idem", b"\x08\x01", request_id="r1").replayed  # a true retry
    with pytest.raises(InvalidArgument, match=r"request_id 'r1' was used for a different write .* made version 1"):
        put_request(store, other)
    assert store.session("idem").head_version == first.version == 1  # nothing written


def test_a_frame_failing_its_checksum_is_reported_once_and_keeps_its_place_in_the_chain(
    config: StoreConfig,
) -> None:
    # verify reported it twice (first as corrupt "metadata"), and inspect's chain column
    # restarted its count after the CORRUPT row.
    with Store(config) as store:
        for v in range(1, 4):  # a FULL frame, then two DELTAs (CHAINS: up to 3 after the FULL)
            store.put("m", state_of("m", v))
        assert [i.frame_kind for i in store.list_versions("m")[0]] == [FrameKind.DELTA, FrameKind.DELTA, FrameKind.FULL]
    env = lmdb.open(str(config.data_dir / "lmdb"), max_dbs=8)
    with env.begin(write=True, db=env.open_db(b"frames")) as txn:
        key = b"m\x00" + (2).to_bytes(8, "big")
        value = bytearray(txn.get(key) or b"")
        value[-3] ^= 0x40  # in the payload: the frame's checksum fails, its header parses
        txn.put(key, bytes(value))
    env.close()
    verify = ckpt("verify", "m", "--data-dir", str(config.data_dir))
    failures = [line for line in verify.stderr.decode().splitlines() if line.startswith("FAIL")]
    assert len(failures) == 1, failures
    assert failures[0].startswith("FAIL session 'm': frame checksum mismatch for version 2")
    assert "metadata" not in failures[0]
    inspect = ckpt("inspect", "m", "--data-dir", str(config.data_dir)).stdout.decode().splitlines()
    chain_column = {line.split()[0]: line.split()[2] for line in inspect[2:]}
    assert chain_column == {"1": "0", "2": "1", "3": "2"}, inspect
    assert inspect[3].split()[1] == "CORRUPT"


@pytest.mark.parametrize("step", ["writer", "sweeper", "storage", "lock"])
def test_a_close_interrupted_midway_is_finished_by_the_next(
    config: StoreConfig, step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ctrl-C inside close(): each of its steps in turn raises KeyboardInterrupt once, before doing its work.
    store = Store(config)
    store.put("s", state_of("s", 1))
    assert store._sweeper is not None and store._lock_file is not None
    target, name = {
        "writer": (store._writer._thread, "join"),
        "sweeper": (store._sweeper, "join"),
        "storage": (store._storage, "close"),
        "lock": (store._lock_file, "close"),
    }[step]
    real = getattr(target, name)
    interrupts = iter([True])

    def interrupted_once() -> None:
        if next(interrupts, False):
            raise KeyboardInterrupt
        real()

    monkeypatch.setattr(target, name, interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        store.close()
    store.close()
    assert not store._writer.alive()
    with pytest.raises(Unavailable, match="closed"):
        store.get("s")
    with Store(config) as reopened:  # the directory is no longer locked by this process
        assert reopened.get("s").state == state_of("s", 1)
    store.close()  # and a close after that does nothing
