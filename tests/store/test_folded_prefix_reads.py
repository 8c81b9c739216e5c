"""Reading a version of a folded run from its sealed FULL head decodes only the head's first bytes it needs
(codec.sealed_prefix), checked by the version's PREFIX frame; damage to the head is named as a whole decode
names it."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from ckpt.codec import FrameKind, _zstd, decode_latest
from ckpt.sidecar import DataLoss, Store, StoreConfig, WriteMode
from ckpt.sidecar.store import keys
from ckpt.sidecar.store.prefixes import named
from tests.store.support import every_version, frames_table, history_states, kinds, long_chains, merged


@pytest.fixture
def config(tmp_path: Path) -> StoreConfig:
    return long_chains(StoreConfig(data_dir=tmp_path / "data", sweep_interval_seconds=3600))


def big_patches(seed: int, steps: int = 8) -> list[bytes]:
    """MERGE patches of a state past one zstd block (128 KiB): a repeated string field (8), ~40 KB a step."""
    rng = random.Random(seed)
    texts = [bytes(rng.choice(b"abcdefgh ") for _ in range(40_000)) for _ in range(steps)]
    return [b"\x42" + varint(len(text)) + text for text in texts]


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def written_and_closed(config: StoreConfig, patches: list[bytes]) -> None:
    with Store(config) as store:
        for p in patches:
            store.put("s", p, mode=WriteMode.MERGE)  # folded at close


def test_every_version_of_a_folded_session_reads_back_without_decoding_the_whole_head(
    config: StoreConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    patches = big_patches(1)
    expected = merged(patches)
    written_and_closed(config, patches)
    with Store(config) as store:
        assert kinds(store, "s") == [FrameKind.FULL] + [FrameKind.PREFIX] * 6 + [FrameKind.FULL]

        def whole(*_: object, **__: object) -> object:
            raise AssertionError("decoded the whole head")

        with monkeypatch.context() as m:
            m.setattr(_zstd, "decompress_sealed", whole)
            m.setattr(_zstd, "new_reader", whole)
            assert [store.get("s", v, use_cache=False).state for v in range(2, 8)] == expected[1:7]
        assert every_version(store, "s") == expected
        assert history_states(store, "s", page_size=3) == expected


def test_a_folded_session_of_small_states_reads_back_reopened(config: StoreConfig) -> None:
    patches = [b"\x08" + bytes([i]) for i in range(1, 30)] + [b"\x12\x03abc"] * 10
    written_and_closed(config, patches)
    with Store(config) as store:
        assert kinds(store, "s")[-2] is FrameKind.PREFIX
        assert every_version(store, "s") == merged(patches)


@pytest.mark.parametrize("at", [-1, -2000, 40])  # in the payload's end, its middle, the header
def test_a_damaged_head_is_named_as_a_whole_decode_names_it(config: StoreConfig, at: int) -> None:
    written_and_closed(config, big_patches(2))
    key = keys.frame_key(keys.session_key("s"), 8)
    with frames_table(config.data_dir) as (txn, frames):
        raw = txn.get(key, db=frames)
        assert raw is not None
        value = bytearray(raw)
        value[at if at < 0 else 2 + int.from_bytes(value[:2], "little") + at] ^= 0x01
        txn.put(key, bytes(value), db=frames)
        frame = bytes(value[2 + int.from_bytes(value[:2], "little") :])
    with pytest.raises(Exception) as whole:
        decode_latest([frame])
    with Store(replace(config, fold_on_close_seconds=0), readonly=True) as store:
        with pytest.raises(DataLoss) as caught:
            store.get("s", 3, use_cache=False)
        assert str(caught.value) == named("s", 8, whole.value)  # the head, as its whole decode names it
        with pytest.raises(DataLoss) as caught:
            store.get("s", 8, use_cache=False)
        assert str(caught.value) == f"session 's' version 8: {whole.value}"
