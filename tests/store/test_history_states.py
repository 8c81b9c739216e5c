"""A session's history with its states (Store.list_versions with include_states): every listed state is
what a Get of that version returns, across pages, tokens, start versions and byte-bounded pages; damage is
DataLoss naming the version; a single state over the page's bytes is StateTooLarge naming it.

Random REPLACE and MERGE sequences, typed and untyped, under chain policies that restart chains every few
versions (so that pages start and end inside chains and span several).
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import lmdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckpt.codec import ChainPolicy, FrameKind
from ckpt.sidecar import Store, StoreConfig, WriteMode
from ckpt.sidecar.errors import DataLoss, InvalidArgument, NotFound, StateTooLarge
from ckpt.sidecar.server.convert import version_info_pb
from ckpt.sidecar.store import VersionInfo, keys
from ckpt.sidecar.store.listings import version_info_bytes
from ckpt.v1 import service_pb2
from tests.support import AGENT_STATE, agent_file, agent_state_class, descriptor_set_of

STATE = agent_state_class()
POLICIES = {
    "depth 2": ChainPolicy(frame_cost_bytes=0, max_depth=2, decode_floor_bytes=0, max_superseded_fraction=0.3),
    "depth 5": ChainPolicy(frame_cost_bytes=0, max_depth=5),
    "default": ChainPolicy(),
}

texts = st.text(alphabet="abcdefghij xyz0123456789", max_size=40)


@st.composite
def typed_write(draw: Any) -> tuple[WriteMode, bytes]:
    msg = STATE()
    for key in draw(st.lists(st.sampled_from(["e1", "e2", "e3"]), max_size=2, unique=True)):
        msg.entities[key].name = draw(texts)
    msg.log.extend(draw(st.lists(texts, max_size=2)))
    if draw(st.booleans()):
        msg.step = draw(st.integers(0, 1000))
    return draw(st.sampled_from([WriteMode.REPLACE, WriteMode.MERGE])), msg.SerializeToString()


# Opaque bytes, but a MERGE patch must still be protobuf wire format: one length-delimited field 1.
untyped_write = st.tuples(
    st.sampled_from([WriteMode.REPLACE, WriteMode.MERGE]),
    st.binary(max_size=120).map(lambda b: bytes([0x0A, len(b)]) + b),
)


def listed(store: Store, page_size: int, max_page_bytes: int, start_version: int = 0) -> list[Any]:
    """Every page of the history with states, followed by its tokens."""
    out: list[Any] = []
    token = ""
    while True:
        page, token = store.list_versions(
            "s",
            page_size=page_size,
            page_token=token,
            max_page_bytes=max_page_bytes,
            include_states=True,
            start_version=start_version,
        )
        assert page, "a page holds one version at least"
        out += page
        if not token:
            return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    typed=st.booleans(),
    data=st.data(),
    policy=st.sampled_from(sorted(POLICIES)),
    page_size=st.integers(1, 12),
    max_page_bytes=st.sampled_from([0, 400, 2000]),
)
def test_every_listed_state_is_what_a_get_of_its_version_returns(
    typed: bool, data: st.DataObject, policy: str, page_size: int, max_page_bytes: int
) -> None:
    sequence = data.draw(st.lists(typed_write() if typed else untyped_write, min_size=1, max_size=20))
    start = data.draw(st.integers(0, len(sequence) + 2))
    with tempfile.TemporaryDirectory() as tmp:
        config = StoreConfig(data_dir=Path(tmp) / "data", chain_policy=POLICIES[policy], sweep_interval_seconds=3600)
        with Store(config) as store:
            if typed:
                store.register_types(descriptor_set_of(agent_file()))
            for n, (mode, state) in enumerate(sequence, 1):
                store.put("s", state, mode=mode, expected_version=n - 1, message_type=AGENT_STATE if typed else "")
        with Store(replace(config, cache_size_bytes=0)) as cold:
            head = len(sequence)
            top = min(start, head) if start else head
            history = listed(cold, page_size, max_page_bytes, start)
            assert [r.version for r in history] == list(range(top, 0, -1))
            infos, _ = cold.list_versions("s", page_size=1000, start_version=start)
            for got, info in zip(history, infos, strict=True):
                want = cold.get("s", got.version)
                assert got.state == want.state, got.version
                assert got.info == want.info == info
                if not typed and sequence[got.version - 1][0] is WriteMode.REPLACE:
                    assert got.state == sequence[got.version - 1][1]


def untyped_store(tmp: Path, versions: int, policy: ChainPolicy, size: int = 200) -> StoreConfig:
    config = StoreConfig(data_dir=tmp / "data", chain_policy=policy, sweep_interval_seconds=3600)
    with Store(config) as store:
        for v in range(1, versions + 1):
            store.put("s", bytes(i % 251 for i in range(size)) + b"tail %d" % v)
    return replace(config, cache_size_bytes=0)


def flip_frame_byte(config: StoreConfig, version: int) -> None:
    env = lmdb.open(str(config.data_dir / "lmdb"), max_dbs=8)
    try:
        frames = env.open_db(b"frames")
        with env.begin(write=True) as txn:
            key = keys.frame_key(keys.session_key("s"), version)
            value = bytearray(txn.get(key, db=frames) or b"")
            value[-3] ^= 0xFF  # inside the zstd payload
            txn.put(key, bytes(value), db=frames)
    finally:
        env.close()


@pytest.mark.parametrize("damaged", [1, 3, 4, 6])
def test_a_flipped_byte_in_a_stored_frame_is_data_loss_naming_the_version(tmp_path: Path, damaged: int) -> None:
    # Chains of three (depth 2): the flip hits a FULL frame or a delta, at a page's edge or inside it.
    config = untyped_store(tmp_path, 6, ChainPolicy(frame_cost_bytes=0, max_depth=2))
    with Store(config) as store:
        _, frames = store.frames_of("s")
    starts = [v for v, info, _ in frames if not isinstance(info, Exception) and info.frame_kind.name == "FULL"]
    assert starts == [1, 4]
    chain = range(1, 4) if damaged < 4 else range(4, 7)
    flip_frame_byte(config, damaged)
    names_it = rf"session 's'.* version {damaged}\b"
    with Store(config) as store:
        with pytest.raises(DataLoss, match=names_it):
            store.get("s", damaged)
        # A page holding the damaged version, or a later version of its chain: DataLoss naming it.
        for start in range(damaged, chain[-1] + 1):
            for page_size in (1, 1000):
                with pytest.raises(DataLoss, match=names_it):
                    store.list_versions("s", page_size=page_size, include_states=True, start_version=start)
        # The other chain's versions still read.
        other = range(4, 7) if damaged < 4 else range(1, 4)
        page, _ = store.list_versions("s", page_size=3, include_states=True, start_version=other[-1])
        assert [r.version for r in page] == list(reversed(other))
        assert [r.state for r in page] == [store.get("s", v).state for v in reversed(other)]
        if damaged > chain[0]:  # the chain's versions before the damage too
            page, _ = store.list_versions("s", include_states=True, start_version=damaged - 1)
            assert [r.version for r in page] == list(range(damaged - 1, 0, -1))


def test_a_page_ends_early_by_the_bytes_of_its_states(tmp_path: Path) -> None:
    config = untyped_store(tmp_path, 10, ChainPolicy(frame_cost_bytes=0, max_depth=3), size=1000)
    with Store(config) as store:
        page, token = store.list_versions("s", page_size=100, include_states=True, max_page_bytes=3500)
        assert [r.version for r in page] == [10, 9, 8]  # ~1.1 KB each with its metadata
        assert token
        page, _ = store.list_versions("s", page_size=100, page_token=token, include_states=True, max_page_bytes=3500)
        assert [r.version for r in page] == [7, 6, 5]
        # The same limit without states: one page.
        infos, token = store.list_versions("s", page_size=100, max_page_bytes=3500)
        assert len(infos) == 10 and not token


# (target_page_bytes, max_page_bytes, the first two pages): entries of ~1.1 KB with their metadata.
TARGET_PAGES = [
    (0, 0, [list(range(10, 0, -1)), []]),
    (3500, 0, [[10, 9, 8], [7, 6, 5]]),
    (3500, 2300, [[10, 9], [8, 7]]),  # the smaller of the two ends a page
    (2300, 3500, [[10, 9], [8, 7]]),
    (500, 0, [[10], [9]]),  # a first version over the target is listed all the same
    (500, 1100, [[10], [9]]),
]


@pytest.mark.parametrize(("target", "limit", "want"), TARGET_PAGES)
def test_a_page_ends_at_its_target_bytes_yet_holds_a_first_state_over_it(
    tmp_path: Path, target: int, limit: int, want: list[list[int]]
) -> None:
    config = untyped_store(tmp_path, 10, ChainPolicy(frame_cost_bytes=0, max_depth=3), size=1000)
    with Store(config) as store:
        pages, token = [], ""
        for _ in want:
            page, token = store.list_versions(
                "s", page_size=100, page_token=token, include_states=True, max_page_bytes=limit,
                target_page_bytes=target,
            )  # fmt: skip
            pages.append([r.version for r in page])
            assert [r.state for r in page] == [store.get("s", r.version).state for r in page]
            if not token:
                break
        pages += [[]] * (len(want) - len(pages))
        assert pages == want


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-1, r"^target_page_bytes must be in 0\.\.\d+ \(0 = none\), got -1$"),
        ("1", r"^target_page_bytes must be an int \(0 = none\), not str$"),
    ],
)
def test_a_bad_target_page_bytes_is_refused_naming_it(tmp_path: Path, value: Any, message: str) -> None:
    config = untyped_store(tmp_path, 2, ChainPolicy())
    with Store(config) as store, pytest.raises(InvalidArgument, match=message):
        store.list_versions("s", include_states=True, target_page_bytes=value)


def test_a_single_state_over_the_page_bytes_is_state_too_large_naming_it(tmp_path: Path) -> None:
    config = untyped_store(tmp_path, 3, ChainPolicy(frame_cost_bytes=0, max_depth=3), size=5000)
    with Store(config) as store:
        with pytest.raises(StateTooLarge, match=r"session .s. version 2: its state is 5006 bytes, more than the 4000"):
            store.list_versions("s", include_states=True, max_page_bytes=4000, start_version=2)
        assert store.get("s", 2).state.endswith(b"tail 2")  # a Get is not bounded by a page


@pytest.mark.parametrize("over", [0, 1])
def test_a_state_of_exactly_the_page_bytes_is_listed_alone_whatever_its_labels(tmp_path: Path, over: int) -> None:
    # The budget bounds states as Get does: a version whose state fits is listed, its metadata on top.
    labels = {f"label-{i:02d}": "v" * 128 for i in range(64)}
    with Store(StoreConfig(data_dir=tmp_path)) as store:
        store.put("s", b"x" * (4000 + over), labels=labels)
        if over:
            with pytest.raises(StateTooLarge, match=r"version 1: its state is 4001 bytes, more than the 4000 bytes"):
                store.list_versions("s", include_states=True, max_page_bytes=4000)
            return
        page, token = store.list_versions("s", include_states=True, max_page_bytes=4000)
        assert [(r.version, r.state, r.info.labels) for r in page] == [(1, b"x" * 4000, labels)] and not token


def test_bad_arguments_are_refused_naming_them(tmp_path: Path) -> None:
    config = untyped_store(tmp_path, 2, ChainPolicy())
    with Store(config) as store:
        with pytest.raises(
            InvalidArgument, match=r"^start_version must be in 0\.\.2\*\*64-1 \(a uint64\) \(0 = the head\), got -1$"
        ):
            store.list_versions("s", include_states=True, start_version=-1)
        with pytest.raises(NotFound, match="session 'nope' does not exist"):
            store.list_versions("nope", include_states=True)
        _, token = store.list_versions("s", page_size=1)
        store.put("t", b"\x08\x01")
        with pytest.raises(InvalidArgument, match="page_token"):
            store.list_versions("t", page_token=token, include_states=True)


@pytest.mark.parametrize("state_size", [0, 100, 20_000, 3 << 20])
def test_the_page_byte_estimate_of_an_entry_with_its_state_is_an_upper_bound(state_size: int) -> None:
    labels = {"k": "v" * 100}
    info = VersionInfo(2**64 - 1, 2**64 - 1, 2**64 - 1, FrameKind.PATCH, 2**64 - 1, state_size, labels, WriteMode.MERGE)
    encoded = service_pb2.ListVersionsResponse(versions=[version_info_pb(info, b"x" * state_size)]).ByteSize()
    assert encoded <= version_info_bytes(info, with_state=True) < encoded + 64
