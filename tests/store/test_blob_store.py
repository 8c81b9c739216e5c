"""Blobs in the store: retention's rule for references, files without a record, abandoned temporary
files, and a removal racing a store of the same bytes."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import pytest
import xxhash

from ckpt.codec import ChainPolicy
from ckpt.sidecar.config import Retention, StoreConfig
from ckpt.sidecar.errors import InvalidArgument, NotFound, ResourceExhausted
from ckpt.sidecar.store import Store
from ckpt.sidecar.store.ops import Op


def config(data_dir: Path, **changes: object) -> StoreConfig:
    # Every version a FULL frame: retention keeps exactly the newest versions asked for.
    return StoreConfig(data_dir=data_dir, chain_policy=ChainPolicy(max_depth=0), **changes)  # type: ignore[arg-type]


def files_of(data_dir: Path) -> list[str]:
    root = data_dir / "blobs" / "sha256"
    return sorted(p.name for p in root.rglob("*") if p.is_file()) if root.is_dir() else []


def test_retention_drops_a_reference_once_no_version_kept_names_it_and_it_is_older(tmp_path: Path) -> None:
    with Store(config(tmp_path, retention=Retention(keep_last_versions=2))) as store:
        named = store.put_blob("s", [b"screenshot"])
        kept = store.put_blob("s", [b"a page"])
        other = store.put_blob("t", [b"screenshot"])  # the same bytes, another session
        store.put("s", b"v1 " + named.uri.encode())
        store.put("s", b"v2 " + named.uri.encode() + kept.uri.encode())
        store.put("s", b"v3 " + kept.uri.encode())
        store.sweep()  # keeps v2 and v3: v2 names it
        assert set(store.blob_refs("s")) == {named.sha256, kept.sha256}
        store.put("s", b"v4 " + kept.uri.encode())
        store.sweep()  # keeps v3 and v4: neither names it
        assert store.blob_refs("s") == [kept.sha256]
        assert store.blob(named.sha256).ref_count == 1  # t's reference keeps it
        assert other.sha256 == named.sha256
        fresh = store.put_blob("s", [b"uploaded before the checkpoint naming it"])
        store.put("s", b"v5 names nothing yet")
        store.sweep()  # keeps v4 and v5; the reference is newer than v4: kept
        assert fresh.sha256 in store.blob_refs("s")
        store.delete_session("t")
        with pytest.raises(NotFound):
            store.blob(named.sha256)
        assert files_of(tmp_path) == sorted([kept.sha256, fresh.sha256])


def test_a_version_written_while_retention_read_the_states_keeps_its_blob(tmp_path: Path) -> None:
    # The release re-checks the head in its transaction: a new version may name the blob.
    with Store(config(tmp_path, retention=Retention(keep_last_versions=1))) as store:
        ref = store.put_blob("s", [b"bytes"])
        store.put("s", b"v1")
        store.put("s", b"v2")
        blobs = store._blobs
        with store.read() as txn:
            plan = blobs._unnamed(txn, b"s")
        assert plan is not None and plan.shas == [bytes.fromhex(ref.sha256)]
        store.put("s", b"v3 " + ref.uri.encode())
        assert blobs._submit(Op(blobs._release_op(b"s", plan))).wait() == 0
        assert store.blob(ref.sha256).ref_count == 1


def test_put_blob_checks_the_hash_and_the_limit_and_stores_nothing_otherwise(tmp_path: Path) -> None:
    with Store(config(tmp_path, max_blob_bytes=10)) as store:
        with pytest.raises(ResourceExhausted, match=r"max_blob_bytes \(10\)"):
            store.put_blob("s", [b"123456", b"78901"])
        with pytest.raises(InvalidArgument, match="expected_sha256"):
            store.put_blob("s", [b"abc"], expected_sha256=hashlib.sha256(b"abd").hexdigest())
        assert files_of(tmp_path) == []
        assert list((tmp_path / "blobs" / "tmp").iterdir()) == []
        assert store.blob_refs("s") == []


def test_put_blob_records_the_xxh3_128_of_the_bytes_for_reads_to_check(tmp_path: Path) -> None:
    with Store(config(tmp_path)) as store:
        ref = store.put_blob("s", [b"first chunk, ", b"second chunk"])
        assert store.blob(ref.sha256).xxh3_128 == xxhash.xxh3_128(b"first chunk, second chunk").digest()


def test_a_sweep_removes_files_without_a_record_and_abandoned_temporary_files(tmp_path: Path) -> None:
    with Store(config(tmp_path)) as store:
        ref = store.put_blob("s", [b"kept"])
        orphan = hashlib.sha256(b"orphan").hexdigest()
        path = store.blob_files.path(orphan)  # as a crash between a move and its commit leaves it
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"orphan")
        abandoned = store.blob_files.temp_dir / ("0" * 32 + ".part")
        abandoned.write_bytes(b"half")
        old = time.time() - 3600
        os.utime(abandoned, (old, old))
        held = store.blob_files.new_temp(100)  # a writer still writing: left alone, however old
        os.utime(held.path, (old, old))
        store.sweep()
        assert files_of(tmp_path) == [ref.sha256]
        assert sorted(p.name for p in store.blob_files.temp_dir.iterdir()) == [held.name]
        held.discard()


def test_stores_racing_removals_of_the_same_bytes_never_lose_an_acknowledged_blob(tmp_path: Path) -> None:
    data = os.urandom(4096)
    with Store(config(tmp_path)) as store:
        errors: list[str] = []

        def cycle(session: str) -> None:
            for _ in range(40):
                ref = store.put_blob(session, [data])
                if store.blob_files.path(ref.sha256).read_bytes() != data:
                    errors.append(f"{session}: acknowledged, file not there")
                store.delete_session(session)

        def hold() -> None:
            for _ in range(40):
                ref = store.put_blob("holder", [data])
                if store.blob_files.path(ref.sha256).read_bytes() != data:
                    errors.append("holder: acknowledged, file not there")

        threads = [threading.Thread(target=cycle, args=(f"s{i}",)) for i in range(3)]
        threads.append(threading.Thread(target=hold))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert store.blob(hashlib.sha256(data).hexdigest()).ref_count == 1  # the holder's
        assert files_of(tmp_path) == [hashlib.sha256(data).hexdigest()]
