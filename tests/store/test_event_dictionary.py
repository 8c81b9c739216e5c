"""The store's event dictionary: trained once on the store's first events, stored in its meta table, and
the blocks compressed from then on start from it; every read, in this process or another, finds it."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest

from ckpt.sidecar import DataLoss, EventQuery, NewEvent, Retention, Store, StoreConfig
from ckpt.sidecar.store.eventdicts import (
    DICTIONARY_BYTES,
    EVENT_DICTIONARY_KEY,
    REGISTRY,
    TRAIN_SAMPLE_BYTES,
    dictionary_id,
    train,
)
from ckpt.sidecar.store.events import DICTIONARY_FORMAT, SEAL_EVENTS
from tests.support import ckpt

TOOLS = ("read_file", "run_tests", "search_code", "edit_file", "list_dir")
WORDS = [
    "the",
    "agent",
    "reads",
    "a",
    "file",
    "then",
    "runs",
    "the",
    "tests",
    "and",
    "edits",
    "code",
    "until",
    "every",
    "check",
    "passes",
    "again",
]


def message(rng: random.Random, i: int) -> bytes:
    """An agent's message as a JSON event payload (~1 KB), like those the trajectories log."""
    role = rng.choice(("user", "assistant", "tool"))
    body: dict[str, object] = {
        "role": role,
        "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 160))),
    }
    if role == "assistant":
        tool = rng.choice(TOOLS)
        args = json.dumps({"path": f"src/module_{rng.randint(0, 999)}.py", "line": i})
        body["tool_calls"] = [
            {
                "id": f"call_{rng.getrandbits(64):016x}",
                "type": "function",
                "function": {"name": tool, "arguments": args},
            }
        ]
    return json.dumps(body, separators=(",", ":")).encode()


def events(rng: random.Random, n: int, start: int = 0) -> list[NewEvent]:
    return [
        NewEvent(rng.choice(("message", "tool_call")), message(rng, start + i), {"n": str(start + i)}) for i in range(n)
    ]


def every(store: Store, session: str) -> list[tuple[int, str, bytes]]:
    out: list[tuple[int, str, bytes]] = []
    token = ""
    while True:
        page = store.read_events(session, EventQuery(page_token=token))
        out += [(e.seq, e.type, e.payload) for e in page.events]
        token = page.next_page_token
        if not token:
            return out


def formats(store: Store) -> dict[bytes, list[int]]:
    """Each session's stored event values' format bytes, in key order."""
    assert store.tables.events is not None
    out: dict[bytes, list[int]] = {}
    with store.read() as txn:
        for key, value in txn.scan(store.tables.events):
            out.setdefault(bytes(key).partition(b"\0")[0], []).append(value[2])
    return out


def stored_dictionary(store: Store) -> bytes | None:
    assert store.tables.meta is not None
    with store.read() as txn:
        found = txn.get(EVENT_DICTIONARY_KEY, db=store.tables.meta)
        return bytes(found) if found is not None else None


@pytest.fixture
def config(tmp_path: Path) -> StoreConfig:
    return StoreConfig(data_dir=tmp_path / "data", sweep_interval_seconds=3600)


@pytest.fixture
def written(config: StoreConfig) -> Iterator[tuple[Store, dict[str, list[NewEvent]]]]:
    """A store with 20 sessions appended to in turn, one event a call, past the samples a dictionary needs;
    then 20 sessions more, begun after it (a few events each)."""
    rng = random.Random(7)
    logs: dict[str, list[NewEvent]] = {f"s{i:02d}": [] for i in range(40)}
    early = list(logs.items())[:20]
    with Store(config) as store:
        total = 0
        while total < 2 * TRAIN_SAMPLE_BYTES:
            for session, log in early:
                (event,) = events(rng, 1, len(log))
                store.append_events(session, [event])
                log.append(event)
                total += len(event.payload)
        assert stored_dictionary(store) is not None
        for _ in range(12):
            for session, log in list(logs.items())[20:]:
                (event,) = events(rng, 1, len(log))
                store.append_events(session, [event])
                log.append(event)
        yield store, logs


def test_a_dictionary_is_trained_once_and_later_blocks_start_from_it(
    config: StoreConfig, written: tuple[Store, dict[str, list[NewEvent]]]
) -> None:
    store, logs = written
    for session, log in logs.items():
        assert [(e[1], e[2]) for e in every(store, session)] == [(e.type, e.payload) for e in log]
    content = stored_dictionary(store)
    assert content is not None and len(content) <= DICTIONARY_BYTES + 1024
    assert int.from_bytes(content[4:8], "little") == dictionary_id(content)
    # Every block of the sessions begun since starts from it; the earlier ones' do once compressed again.
    stored = formats(store)
    assert {f for i in range(20, 40) for f in stored[f"s{i:02d}".encode()]} == {DICTIONARY_FORMAT}
    assert sum(stored[f"s{i:02d}".encode()][0] == DICTIONARY_FORMAT for i in range(20)) >= 10
    store.close()
    with Store(config) as again:  # the next open neither trains nor replaces it
        again.append_events("s00", events(random.Random(9), 200))
        assert every(again, "s00")[-1][0] == len(logs["s00"]) + 200
        assert stored_dictionary(again) == content
    assert ckpt("verify", "--data-dir", str(config.data_dir)).returncode == 0


def test_another_process_reads_the_blocks_with_the_dictionary_it_finds_stored(
    config: StoreConfig, written: tuple[Store, dict[str, list[NewEvent]]]
) -> None:
    store, logs = written
    want = [e.payload for e in logs["s33"]]
    store.close()
    script = (
        "import sys\n"
        "from ckpt.sidecar import EventQuery, Store, StoreConfig\n"
        "with Store(StoreConfig(data_dir=sys.argv[1]), readonly=True) as s:\n"
        "    page = s.read_events('s33', EventQuery(page_size=1000))\n"
        "    sys.stdout.buffer.write(b''.join(len(e.payload).to_bytes(4, 'big') + e.payload for e in page.events))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(config.data_dir)], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    got, out = [], done.stdout
    while out:
        n = int.from_bytes(out[:4], "big")
        got.append(out[4 : 4 + n])
        out = out[4 + n :]
    assert got == want


def test_sealed_forked_and_retained_blocks_keep_reading(tmp_path: Path) -> None:
    retention = Retention(keep_last_events=300)
    config = StoreConfig(data_dir=tmp_path / "data", retention=retention, sweep_interval_seconds=3600)
    rng = random.Random(5)
    with Store(config) as store:
        first = events(rng, 2 * TRAIN_SAMPLE_BYTES // 600)
        for i in range(0, len(first), 500):
            store.append_events("first", first[i : i + 500])
        log = events(rng, 2 * SEAL_EVENTS + 40)
        for i in range(0, len(log), 10):
            store.append_events("long", log[i : i + 10])
        store.put("long", b"state")
        store.fork("long", 0, "copy", copy_events=True)
        assert store.sweep().events_removed > 0
        kept = [e.payload for e in log[-300:]]
        assert [e[2] for e in every(store, "long")] == kept
        assert [e[2] for e in every(store, "copy")][-300:] == kept
        assert set(formats(store)[b"long"]) == {DICTIONARY_FORMAT}
    assert ckpt("verify", "--data-dir", str(config.data_dir)).returncode == 0


def test_a_damaged_dictionary_is_data_loss_naming_the_block(
    config: StoreConfig, written: tuple[Store, dict[str, list[NewEvent]]]
) -> None:
    store, _ = written
    content = stored_dictionary(store)
    assert content is not None
    store.close()
    env = lmdb.open(str(config.data_dir / "lmdb"), max_dbs=16)
    with env.begin(write=True) as txn:
        flipped = bytearray(content)
        flipped[len(flipped) // 2] ^= 0x10
        txn.put(EVENT_DICTIONARY_KEY, bytes(flipped), db=env.open_db(b"meta", txn=txn))
    env.close()
    # Read in a process of its own: this one knows the dictionary (by its id) from before the damage.
    script = (
        "import sys\n"
        "from ckpt.sidecar import DataLoss, EventQuery, Store, StoreConfig\n"
        "with Store(StoreConfig(data_dir=sys.argv[1]), readonly=True) as s:\n"
        "    try:\n"
        "        s.read_events('s25', EventQuery())\n"
        "    except DataLoss as exc:\n"
        "        print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(config.data_dir)], capture_output=True, timeout=120)
    said = done.stdout.decode()
    assert done.returncode == 0 and "session 's25' event seq 1" in said, said + done.stderr.decode()
    assert f"dictionary {dictionary_id(content)}" in said and "fails its check" in said
    verify = ckpt("verify", "--data-dir", str(config.data_dir))
    assert verify.returncode == 1 and f"dictionary {dictionary_id(content)}" in verify.stderr.decode()


def test_a_trained_dictionary_is_named_by_its_content() -> None:
    rng = random.Random(11)
    samples = [message(rng, i) for i in range(600)]
    content = train(samples)
    assert content[:4] == b"\x37\xa4\x30\xec"
    assert int.from_bytes(content[4:8], "little") == dictionary_id(content)
    assert 32768 <= dictionary_id(content) < 2**31
    assert REGISTRY.add(content).dict_id == dictionary_id(content)
    with pytest.raises(DataLoss, match="not a zstd dictionary"):
        REGISTRY.add(b"\0" * 64)
    renamed = bytearray(content)
    renamed[4:8] = (dictionary_id(content) + 1).to_bytes(4, "little")
    with pytest.raises(DataLoss, match=rf"dictionary {dictionary_id(content) + 1} fails its check"):
        REGISTRY.add(bytes(renamed))
    with pytest.raises(DataLoss, match=r"^here: the event block is compressed with dictionary 99999, which the store"):
        REGISTRY.get(99999, "here")
