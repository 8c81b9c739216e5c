"""Blobs through a real sidecar: PutBlob and GetBlob from the Python clients, their limits and errors, and
a blob's life: stored once, removed when no session references it any more."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import io
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ckpt.sidecar.client import (
    AsyncCheckpointClient,
    CheckpointClient,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
)
from ckpt.sidecar.config import StoreConfig
from ckpt.sidecar.errors import InvalidArgument
from ckpt.sidecar.store import Store
from ckpt.v1 import service_pb2, service_pb2_grpc
from tests.server.test_store_process import _alive, _store_process
from tests.support import Sidecar, ckpt, start_sidecar

MIB = 1024 * 1024


def blob_files(data_dir: Path) -> list[Path]:
    root = data_dir / "blobs" / "sha256"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []


def temp_files(data_dir: Path) -> list[Path]:
    root = data_dir / "blobs" / "tmp"
    return sorted(root.iterdir()) if root.is_dir() else []


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    sc = start_sidecar(tmp_path / "data")
    try:
        yield sc
    finally:
        assert sc.stop() == 0, sc.log()


def test_bytes_and_a_file_larger_than_a_chunk_come_back_whole_and_in_ranges(sidecar: Sidecar, tmp_path: Path) -> None:
    big = os.urandom(24 * MIB + 123)
    path = tmp_path / "big.bin"
    path.write_bytes(big)
    with CheckpointClient(sidecar.unix_target) as client:
        small_ref = client.put_blob(b"hello, blob", session_id="s", media_type="text/plain")
        with open(path, "rb") as f:
            ref = client.put_blob(f, session_id="s", media_type="application/octet-stream")
        assert ref.uri == f"ckpt-blob:sha256:{hashlib.sha256(big).hexdigest()}"
        assert ref.content_hash == f"sha256:{hashlib.sha256(big).hexdigest()}"
        assert ref.size_bytes == len(big)
        assert b"".join(client.get_blob(small_ref)) == b"hello, blob"
        chunks = list(client.get_blob(ref))
        assert len(chunks) == 25 and max(map(len, chunks)) == MIB  # streamed in 1 MiB messages
        assert b"".join(chunks) == big
        out = io.BytesIO()
        assert client.get_blob_to(ref.uri, out) == len(big)
        assert out.getvalue() == big
        for offset, length in [(0, 1), (MIB - 1, 2), (5 * MIB + 7, 3 * MIB), (len(big) - 10, 0), (len(big) - 3, 100)]:
            got = b"".join(client.get_blob(ref.content_hash, offset=offset, length=length))
            assert got == big[offset : offset + length if length else None]
        assert b"".join(client.get_blob(ref, offset=len(big))) == b""  # the end itself: nothing, no error
    assert temp_files(sidecar.data_dir) == []


def test_the_async_client_stores_and_reads_blobs(sidecar: Sidecar, tmp_path: Path) -> None:
    data = os.urandom(3 * MIB + 1)
    path = tmp_path / "a.bin"
    path.write_bytes(data)

    async def run() -> None:
        async with AsyncCheckpointClient(sidecar.unix_target) as client:
            with open(path, "rb") as f:
                ref = await client.put_blob(f, session_id="s", chunk_size_bytes=256 * 1024)
            assert ref.size_bytes == len(data)
            assert (
                b"".join([chunk async for chunk in client.get_blob(ref, offset=10, length=MIB)]) == data[10 : MIB + 10]
            )
            out = io.BytesIO()
            assert await client.get_blob_to(ref, out) == len(data)
            assert out.getvalue() == data
            with pytest.raises(NotFoundError):
                await client.get_blob_to("0" * 64, io.BytesIO())

    asyncio.run(run())


class _ShortWrites(io.BytesIO):
    """A file taking at most ``most`` bytes per write, as a file on a filling disk does."""

    def __init__(self, most: int) -> None:
        super().__init__()
        self.most = most

    def write(self, data: Any) -> int:
        return super().write(bytes(memoryview(data)[: self.most]))


def test_both_clients_write_a_blob_whole_into_a_file_taking_short_writes(sidecar: Sidecar) -> None:
    data = os.urandom(2 * MIB + 3)
    with CheckpointClient(sidecar.unix_target) as client:
        ref = client.put_blob(data, session_id="short")
        out = _ShortWrites(100_000)
        assert client.get_blob_to(ref, out) == len(data)
        assert out.getvalue() == data

    async def run() -> bytes:
        async with AsyncCheckpointClient(sidecar.unix_target) as client:
            out = _ShortWrites(100_000)
            assert await client.get_blob_to(ref, out) == len(data)
            return out.getvalue()

    assert asyncio.run(run()) == data


def test_the_same_bytes_from_two_sessions_are_one_file(sidecar: Sidecar) -> None:
    data = os.urandom(2 * MIB)
    with CheckpointClient(sidecar.unix_target) as client:
        a = client.put_blob(data, session_id="a", media_type="image/png")
        b = client.put_blob(data, session_id="b", media_type="image/png", chunk_size_bytes=100_000)
        again = client.put_blob(data, session_id="a")
    assert a.uri == b.uri == again.uri
    assert [p.name for p in blob_files(sidecar.data_dir)] == [hashlib.sha256(data).hexdigest()]
    assert temp_files(sidecar.data_dir) == []


def test_a_hash_other_than_expected_stores_nothing(sidecar: Sidecar) -> None:
    data = b"x" * 1000
    with CheckpointClient(sidecar.unix_target) as client:
        with pytest.raises(InvalidArgumentError, match=r"expected_sha256 .* hash to"):
            client.put_blob(data, session_id="s", expected_sha256=hashlib.sha256(b"other").hexdigest())
        with pytest.raises(InvalidArgumentError, match="expected_sha256 must be a SHA-256"):
            client.put_blob(data, session_id="s", expected_sha256="abc")
        ref = client.put_blob(data, session_id="s", expected_sha256=hashlib.sha256(data).hexdigest())
        assert b"".join(client.get_blob(ref)) == data
    assert len(blob_files(sidecar.data_dir)) == 1
    assert temp_files(sidecar.data_dir) == []


def test_a_blob_over_max_blob_bytes_is_refused_naming_the_limit_and_nothing_is_stored(tmp_path: Path) -> None:
    sc = start_sidecar(tmp_path / "data", "--max-blob-bytes", str(MIB))
    try:
        with CheckpointClient(sc.unix_target) as client:
            with pytest.raises(ResourceExhaustedError, match=r"max_blob_bytes \(1048576 \(ckpt serve --max-blob-bytes"):
                client.put_blob(os.urandom(MIB + 1), session_id="s", chunk_size_bytes=64 * 1024)
            ref = client.put_blob(os.urandom(MIB), session_id="s")  # at the limit: taken
            assert ref.size_bytes == MIB
        assert len(blob_files(sc.data_dir)) == 1
        assert temp_files(sc.data_dir) == []
    finally:
        assert sc.stop() == 0, sc.log()


@pytest.mark.parametrize("limit", [128 * 1024, MIB], ids=["smallest", "one-mib"])
def test_get_blob_sends_chunks_within_the_sidecars_own_message_limit(tmp_path: Path, limit: int) -> None:
    sc = start_sidecar(tmp_path / "data", "--max-message-bytes", str(limit))
    data = os.urandom(3 * limit + 17)
    media_type = "application/" + "x" * 243  # 255 bytes: the longest taken, sent in the first reply
    try:
        with grpc.insecure_channel(sc.unix_target) as channel:
            stub = service_pb2_grpc.CheckpointServiceStub(channel)
            with CheckpointClient(sc.unix_target) as client:
                ref = client.put_blob(data, session_id="s", media_type=media_type, chunk_size_bytes=limit // 2)
            replies = list(stub.GetBlob(service_pb2.GetBlobRequest(sha256=ref.content_hash.removeprefix("sha256:"))))
        assert b"".join(r.chunk for r in replies) == data
        assert replies[0].media_type == media_type
        assert max(r.ByteSize() for r in replies) <= limit
    finally:
        assert sc.stop() == 0, sc.log()


def test_a_stream_cancelled_half_way_stores_nothing_and_leaves_no_temporary_file(sidecar: Sidecar) -> None:
    sent = threading.Event()

    def requests() -> Iterator[service_pb2.PutBlobRequest]:
        yield service_pb2.PutBlobRequest(session_id="s", chunk=b"a" * MIB)
        yield service_pb2.PutBlobRequest(chunk=b"b" * MIB)
        sent.set()
        time.sleep(60)  # the call is cancelled meanwhile

    with grpc.insecure_channel(sidecar.unix_target) as channel:
        call = service_pb2_grpc.CheckpointServiceStub(channel).PutBlob.future(requests())
        assert sent.wait(30)
        deadline = time.monotonic() + 30
        while len(temp_files(sidecar.data_dir)) != 1:  # the sidecar is writing it
            assert time.monotonic() < deadline
            time.sleep(0.02)
        call.cancel()
    deadline = time.monotonic() + 30
    while temp_files(sidecar.data_dir):
        assert time.monotonic() < deadline, temp_files(sidecar.data_dir)
        time.sleep(0.02)
    assert blob_files(sidecar.data_dir) == []


class FailingFile(io.RawIOBase):
    """A binary file whose reads after the first raise EIO (a disk or network file going bad)."""

    def __init__(self) -> None:
        self.reads = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        self.reads += 1
        if self.reads > 1:
            raise OSError(errno.EIO, "Input/output error")
        return b"first part"


def _unreadable_files(tmp_path: Path) -> list[tuple[Callable[[], Any], type[Exception], str]]:
    text = tmp_path / "page.html"
    text.write_text("<html>")
    return [
        (lambda: open(text), TypeError, r"gave str, not bytes: open it in binary mode \('rb'\)"),
        (FailingFile, OSError, r"\[Errno 5\] Input/output error"),
    ]


def test_an_error_reading_the_file_reaches_the_caller_and_nothing_is_stored(sidecar: Sidecar, tmp_path: Path) -> None:
    with CheckpointClient(sidecar.unix_target) as client:
        for make_file, error, words in _unreadable_files(tmp_path):
            with make_file() as f, pytest.raises(error, match=words) as caught:
                client.put_blob(f, session_id="s")
            assert type(caught.value) is error
            with pytest.raises(NotFoundError):
                list(client.get_blob(hashlib.sha256(b"first part").hexdigest()))
        assert blob_files(sidecar.data_dir) == [] and temp_files(sidecar.data_dir) == []
        ref = client.put_blob(b"after", session_id="s")  # the client still works
        assert b"".join(client.get_blob(ref)) == b"after"
    assert len(blob_files(sidecar.data_dir)) == 1


def test_an_error_reading_the_file_reaches_the_async_caller_and_nothing_is_stored(
    sidecar: Sidecar, tmp_path: Path
) -> None:
    async def main() -> None:
        async with AsyncCheckpointClient(sidecar.unix_target) as client:
            for make_file, error, words in _unreadable_files(tmp_path):
                with make_file() as f, pytest.raises(error, match=words) as caught:
                    await client.put_blob(f, session_id="s")
                assert type(caught.value) is error
                with pytest.raises(NotFoundError):
                    await client.get_blob_to(hashlib.sha256(b"first part").hexdigest(), io.BytesIO())
            assert blob_files(sidecar.data_dir) == [] and temp_files(sidecar.data_dir) == []
            ref = await client.put_blob(b"after", session_id="s")  # the client still works
            assert [chunk async for chunk in client.get_blob(ref)] == [b"after"]

    asyncio.run(main())
    assert len(blob_files(sidecar.data_dir)) == 1


# Over 255 bytes (in characters, or in UTF-8 bytes), or not printable.
BAD_MEDIA_TYPES = ["m" * 256, "\u00e9" * 128, "a\x00b", "text/plain\n"]


def test_the_embedded_store_refuses_the_media_types_the_sidecar_does(tmp_path: Path) -> None:
    """Store.put_blob took any media type (2,000 bytes, a NUL, 10 MB), and a blob so stored could not be
    read through a sidecar at its smallest --max-message-bytes: GetBlob's first reply counts on 255 bytes."""
    data_dir, limit = tmp_path / "data", 128 * 1024
    data, longest = os.urandom(limit + 17), "application/" + "x" * 243
    refused: dict[str, str] = {}
    with Store(StoreConfig(data_dir=data_dir)) as store:
        for media_type in [*BAD_MEDIA_TYPES, "m" * 10_000_000, "a\ud800"]:
            with pytest.raises(InvalidArgument) as caught:
                store.put_blob("s", [b"bytes"], media_type=media_type)
            assert str(caught.value).startswith("media_type ")
            assert str(caught.value).endswith("must be at most 255 bytes of printable characters")
            refused[media_type] = str(caught.value)
        assert len(refused["m" * 10_000_000]) < 200  # named, not repeated whole
        sha256 = store.put_blob("s", [data], media_type=longest).sha256
        assert len(blob_files(data_dir)) == 1  # the refused ones stored nothing
    sc = start_sidecar(data_dir, "--max-message-bytes", str(limit))
    try:
        with CheckpointClient(sc.unix_target) as client:
            for media_type in BAD_MEDIA_TYPES:
                with pytest.raises(InvalidArgumentError) as sent:
                    client.put_blob(b"bytes", session_id="s", media_type=media_type)
                assert refused[media_type] in str(sent.value)
        with grpc.insecure_channel(sc.unix_target) as channel:
            stub = service_pb2_grpc.CheckpointServiceStub(channel)
            replies = list(stub.GetBlob(service_pb2.GetBlobRequest(sha256=sha256)))
        assert b"".join(r.chunk for r in replies) == data and replies[0].media_type == longest
        assert len(blob_files(data_dir)) == 1
    finally:
        assert sc.stop() == 0, sc.log()


def test_bad_blob_requests_get_precise_errors(sidecar: Sidecar) -> None:
    with CheckpointClient(sidecar.unix_target) as client:
        ref = client.put_blob(b"12345", session_id="s")
        with pytest.raises(NotFoundError, match="does not exist"):
            list(client.get_blob("f" * 64))
        with pytest.raises(InvalidArgumentError, match="offset 6 is past the end of blob"):
            list(client.get_blob(ref, offset=6))
        with pytest.raises(ValueError, match="names no blob"):
            client.get_blob("ckpt-blob:md5:abc")
    with grpc.insecure_channel(sidecar.unix_target) as channel:
        stub = service_pb2_grpc.CheckpointServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.GetBlob(service_pb2.GetBlobRequest(sha256="ABC")))
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "sha256 must be a SHA-256 in 64 lowercase hex digits" in caught.value.details()
        for requests, words in [
            ([service_pb2.PutBlobRequest(chunk=b"x")], "session_id is empty"),
            ([], "sent no message"),
            (
                [service_pb2.PutBlobRequest(session_id="s"), service_pb2.PutBlobRequest(session_id="t", chunk=b"x")],
                "first message only",
            ),
            ([service_pb2.PutBlobRequest(session_id="s", media_type="a\nb", end=True)], "media_type"),
            # A stream that stops without its end mark is one cut short: its bytes are not the blob.
            ([service_pb2.PutBlobRequest(session_id="s", chunk=b"cut")], "without a message setting end"),
            (
                [
                    service_pb2.PutBlobRequest(session_id="s", chunk=b"whole", end=True),
                    service_pb2.PutBlobRequest(chunk=b"more"),
                ],
                "came after the one that set end",
            ),
        ]:
            with pytest.raises(grpc.RpcError) as caught:
                stub.PutBlob(iter(requests))
            assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
            assert words in caught.value.details()
    assert len(blob_files(sidecar.data_dir)) == 1


def test_deleting_the_last_session_that_references_a_blob_removes_it(sidecar: Sidecar) -> None:
    shared, own = os.urandom(1000), os.urandom(2000)
    with CheckpointClient(sidecar.unix_target) as client:
        client.put("a", b"\x08\x01")
        client.put("b", b"\x08\x01")
        shared_ref = client.put_blob(shared, session_id="a")
        client.put_blob(shared, session_id="b")
        own_ref = client.put_blob(own, session_id="a")
        assert client.delete("a") == 1
        assert b"".join(client.get_blob(shared_ref)) == shared  # b still references it
        with pytest.raises(NotFoundError):
            list(client.get_blob(own_ref))
        assert [p.name for p in blob_files(sidecar.data_dir)] == [shared_ref.uri.rpartition(":")[2]]
        forked = client.fork("b", "c")  # the fork references what its source does
        assert forked.session_id == "c"
        client.delete("b")
        assert b"".join(client.get_blob(shared_ref)) == shared
        client.delete("c")
        with pytest.raises(NotFoundError):
            list(client.get_blob(shared_ref))
        # A session that stored a blob and no version yet: deleting it removes its blobs.
        lone = client.put_blob(b"lonely", session_id="no-versions")
        assert client.delete("no-versions") == 0
        with pytest.raises(NotFoundError):
            list(client.get_blob(lone))
    assert blob_files(sidecar.data_dir) == []


def test_sigkill_during_put_blob_loses_no_acknowledged_blob_and_shows_no_half_stored_one(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    sc = start_sidecar(data_dir)
    store_pid = _store_process(sc)
    acknowledged: dict[str, bytes] = {}
    half = os.urandom(MIB)
    started = threading.Event()
    stop = threading.Event()

    def upload(worker: int) -> None:
        with CheckpointClient(sc.unix_target, retries=0) as client:
            n = 0
            while not stop.is_set():
                n += 1
                data = os.urandom(64 * 1024 * (1 + n % 8))
                try:
                    ref = client.put_blob(data, session_id=f"w{worker}", chunk_size_bytes=32 * 1024)
                except Exception:
                    return  # the kill: its outcome is unknown, and not counted
                acknowledged[ref.uri] = data
                started.set()

    def half_sent() -> Iterator[service_pb2.PutBlobRequest]:
        yield service_pb2.PutBlobRequest(session_id="h", chunk=half[: MIB // 2])
        stop.wait(60)  # the rest never comes

    threads = [threading.Thread(target=upload, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    channel = grpc.insecure_channel(sc.unix_target)
    pending = service_pb2_grpc.CheckpointServiceStub(channel).PutBlob.future(half_sent())
    try:
        assert started.wait(60)
        time.sleep(0.5)
        os.kill(store_pid, signal.SIGKILL)  # both processes, at once: nothing gets to finish
        sc.stop(signal.SIGKILL)
    finally:
        stop.set()
        for t in threads:
            t.join()
        pending.cancel()
        channel.close()
    assert acknowledged
    deadline = time.monotonic() + 30
    while _alive(store_pid):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    restarted = start_sidecar(data_dir)
    try:
        with CheckpointClient(restarted.unix_target) as client:
            for uri, data in acknowledged.items():
                assert b"".join(client.get_blob(uri)) == data, uri
            with pytest.raises(NotFoundError):
                list(client.get_blob(hashlib.sha256(half).hexdigest()))
            with pytest.raises(NotFoundError):
                list(client.get_blob(hashlib.sha256(half[: MIB // 2]).hexdigest()))
    finally:
        assert restarted.stop() == 0, restarted.log()
    # Every file in place is a blob that was acknowledged or whose record committed as the kill came.
    on_disk = {p.name for p in blob_files(data_dir)}
    assert {uri.rpartition(":")[2] for uri in acknowledged} <= on_disk
    assert ckpt("verify", "--data-dir", str(data_dir)).returncode == 0
