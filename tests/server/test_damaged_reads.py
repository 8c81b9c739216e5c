"""Damaged blobs read through a real sidecar: a blob file changed, cut short or gone. Each read answers
DATA_LOSS naming what is damaged, never other bytes as if they were the ones stored."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lmdb
import pytest
import xxhash

from ckpt.sidecar.client import AsyncCheckpointClient, CheckpointClient, DataLossError, NotFoundError
from ckpt.store.v1 import records_pb2
from tests.client.test_node_events_and_blobs import _run_node
from tests.support import Sidecar, start_sidecar

MIB = 1024 * 1024
SIZE = 3 * MIB + 12345  # four GetBlob messages


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    sc = start_sidecar(tmp_path / "data")
    try:
        yield sc
    finally:
        assert sc.stop() == 0, sc.log()


def _stored_blob(sidecar: Sidecar, data: bytes) -> tuple[str, Path]:
    """Store ``data`` as a blob; its SHA-256 and its file (made writable, to damage it)."""
    with CheckpointClient(sidecar.unix_target) as client:
        sha = client.put_blob(data, session_id="s").content_hash.removeprefix("sha256:")
    path = sidecar.data_dir / "blobs" / "sha256" / sha[:2] / sha
    os.chmod(path, 0o644)
    return sha, path


async def _read_async(target: str, sha: str) -> bytes:
    async with AsyncCheckpointClient(target) as client:
        return b"".join([chunk async for chunk in client.get_blob(sha)])


_NODE_READS = """
const [, , , sha, dir] = process.argv;
run(async () => {
  const whole = await failure(async () => { for await (const c of client.getBlob(sha)) void c; });
  const toFile = await failure(() => client.getBlobToFile(sha, path.join(dir, 'copy.bin')));
  return { whole, toFile, files: fs.readdirSync(dir) };
});
"""


def _blob_record(data_dir: Path, sha: str, change: Callable[[records_pb2.BlobRecord], object] | None = None) -> Any:
    """Blob ``sha``'s record as LMDB holds it, after ``change`` (written back) if given."""
    env = lmdb.open(str(data_dir / "lmdb"), max_dbs=16)
    try:
        with env.begin(write=change is not None) as txn:
            blobs = env.open_db(b"blobs", txn=txn, create=False)
            raw = txn.get(bytes.fromhex(sha), db=blobs)
            assert raw is not None
            rec = records_pb2.BlobRecord.FromString(raw)
            if change is not None:
                change(rec)
                txn.put(bytes.fromhex(sha), rec.SerializeToString(), db=blobs)
            return rec
    finally:
        env.close()


def test_a_whole_read_of_a_blob_whose_bytes_changed_is_data_loss_by_its_xxh3_128_and_a_range_is_sent_as_stored(
    sidecar: Sidecar, tmp_path: Path
) -> None:
    data = os.urandom(SIZE)
    sha, path = _stored_blob(sidecar, data)
    assert _blob_record(sidecar.data_dir, sha).xxh3_128 == xxhash.xxh3_128(data).digest()  # kept at put time
    damaged = bytearray(data)
    damaged[2 * MIB + 7] ^= 1
    path.write_bytes(bytes(damaged))
    changed = (
        f"blob {sha}: its file's {SIZE} bytes have XXH3-128 {xxhash.xxh3_128(damaged).hexdigest()}, not the"
        f" {xxhash.xxh3_128(data).hexdigest()} recorded when it was stored: it is damaged"
    )
    with CheckpointClient(sidecar.unix_target) as client:
        with pytest.raises(DataLossError, match=changed):
            b"".join(client.get_blob(sha))
        copy = io.BytesIO()
        with pytest.raises(DataLossError, match=sha):
            client.get_blob_to(sha, copy)
        assert len(copy.getvalue()) < SIZE  # the last chunk is never sent
        # A range is not checked (that would read the whole blob): it is sent as the file holds it.
        assert b"".join(client.get_blob(sha, offset=1)) == bytes(damaged[1:])
        assert b"".join(client.get_blob(sha, length=SIZE - 1)) == bytes(damaged[: SIZE - 1])
    with pytest.raises(DataLossError, match=sha):
        asyncio.run(_read_async(sidecar.unix_target, sha))
    files = tmp_path / "node"
    files.mkdir()
    out = _run_node(_NODE_READS, sidecar.unix_target, sha, str(files))
    assert out["whole"]["code"] == 15 and sha in out["whole"]["message"]  # DATA_LOSS
    assert out["toFile"]["code"] == 15 and out["files"] == []  # no file, not even a partial one
    path.write_bytes(data)  # repaired: read whole again
    with CheckpointClient(sidecar.unix_target) as client:
        assert b"".join(client.get_blob(sha)) == data


def test_a_whole_read_of_a_blob_whose_record_has_no_xxh3_128_is_checked_by_its_sha256_until_stored_again(
    sidecar: Sidecar,
) -> None:
    data = os.urandom(SIZE)
    sha, path = _stored_blob(sidecar, data)
    _blob_record(sidecar.data_dir, sha, lambda rec: rec.ClearField("xxh3_128"))  # as a record written before
    damaged = bytearray(data)
    damaged[SIZE - 1] ^= 0x80
    path.write_bytes(bytes(damaged))
    by_sha256 = f"blob {sha}: its file's {SIZE} bytes hash to {hashlib.sha256(damaged).hexdigest()}: it is damaged"
    with CheckpointClient(sidecar.unix_target) as client:
        with pytest.raises(DataLossError, match=by_sha256):
            b"".join(client.get_blob(sha))
        copy = io.BytesIO()
        with pytest.raises(DataLossError, match=by_sha256):
            client.get_blob_to(sha, copy)
        assert len(copy.getvalue()) < SIZE  # the last chunk is never sent
        path.write_bytes(data)
        assert b"".join(client.get_blob(sha)) == data  # whole again: checked, and sent
        # Stored again (deduplicated: the file in place is kept), its record gains the checksum.
        assert client.put_blob(data, session_id="t").content_hash == f"sha256:{sha}"
        assert _blob_record(sidecar.data_dir, sha).xxh3_128 == xxhash.xxh3_128(data).digest()
        path.write_bytes(bytes(damaged))
        with pytest.raises(DataLossError, match=f"blob {sha}: its file's {SIZE} bytes have XXH3-128"):
            b"".join(client.get_blob(sha))


def test_a_blob_file_cut_short_is_data_loss_for_whole_and_ranged_reads(sidecar: Sidecar) -> None:
    data = os.urandom(SIZE)
    sha, path = _stored_blob(sidecar, data)
    path.write_bytes(data[:100])
    cut = f"blob {sha}: its file ends at byte 100 of the {SIZE} recorded: it is damaged"
    with CheckpointClient(sidecar.unix_target) as client:
        with pytest.raises(DataLossError, match=cut):
            b"".join(client.get_blob(sha))
        with pytest.raises(DataLossError, match=cut):
            b"".join(client.get_blob(sha, offset=50, length=200))
        with pytest.raises(DataLossError, match=cut):  # within what is left: damage all the same
            b"".join(client.get_blob(sha, offset=10, length=20))


def test_a_recorded_blob_whose_file_is_gone_is_data_loss_and_a_removed_one_not_found(sidecar: Sidecar) -> None:
    sha, path = _stored_blob(sidecar, b"small blob " * 100)
    path.unlink()
    with CheckpointClient(sidecar.unix_target) as client:
        with pytest.raises(DataLossError, match=f"blob {sha}: its file .* is missing though its record is kept"):
            b"".join(client.get_blob(sha))
        empty = client.put_blob(b"", session_id="e").content_hash.removeprefix("sha256:")
        assert b"".join(client.get_blob(empty)) == b""
        client.delete("s")  # its last reference: record and file removed
        with pytest.raises(NotFoundError, match=sha):
            b"".join(client.get_blob(sha))


def _lose_frame(data_dir: Path, session: bytes, version: int) -> None:
    env = lmdb.open(str(data_dir / "lmdb"), max_dbs=16)
    try:
        with env.begin(write=True) as txn:
            frames = env.open_db(b"frames", txn=txn, create=False)
            assert txn.delete(session + b"\0" + struct.pack(">Q", version), db=frames)
    finally:
        env.close()
