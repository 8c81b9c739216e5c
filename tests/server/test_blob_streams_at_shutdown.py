"""A blob stream under way when the sidecar is told to stop (SIGTERM) gets the grace period as every
other call does (docs/operations.md: stop accepting, finish in-flight RPCs): a PutBlob is stored whole
and a GetBlob sends every byte, on a real `ckpt serve` process."""

from __future__ import annotations

import hashlib
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc

from ckpt.sidecar.client import CheckpointClient
from ckpt.v1 import service_pb2, service_pb2_grpc
from tests.support import start_sidecar

GRACE = ("--grace-seconds", "30")
CHUNK = b"c" * 1000
CHUNKS = 12
PAUSE_SECONDS = 0.15


def slow_put(session_id: str, started: threading.Event) -> Iterator[service_pb2.PutBlobRequest]:
    yield service_pb2.PutBlobRequest(session_id=session_id, chunk=CHUNK)
    started.set()
    for _ in range(CHUNKS - 1):
        time.sleep(PAUSE_SECONDS)  # the stop arrives in between
        yield service_pb2.PutBlobRequest(chunk=CHUNK)
    yield service_pb2.PutBlobRequest(end=True)


def test_a_put_blob_under_way_at_sigterm_is_stored_whole(tmp_path: Path) -> None:
    sidecar = start_sidecar(tmp_path / "data", *GRACE)
    answer: dict[str, object] = {}
    started = threading.Event()
    try:
        with CheckpointClient(sidecar.unix_target) as c:
            c.put("a", b"\x08\x01")
        with grpc.insecure_channel(sidecar.unix_target) as channel:
            stub = service_pb2_grpc.CheckpointServiceStub(channel)

            def put() -> None:
                try:
                    answer["reply"] = stub.PutBlob(slow_put("a", started), timeout=60)
                except grpc.RpcError as exc:
                    answer["error"] = (exc.code(), exc.details())

            sender = threading.Thread(target=put)
            sender.start()
            assert started.wait(10)
            time.sleep(PAUSE_SECONDS)
            sidecar.process.send_signal(signal.SIGTERM)
            sender.join(60)
        assert sidecar.process.wait(60) == 0, sidecar.log()
    finally:
        sidecar.stop(signal.SIGKILL)
    blob = CHUNK * CHUNKS
    assert "error" not in answer, answer
    reply = answer["reply"]
    assert isinstance(reply, service_pb2.PutBlobResponse)
    assert (reply.sha256, reply.size_bytes) == (hashlib.sha256(blob).hexdigest(), len(blob))
    again = start_sidecar(tmp_path / "data")
    try:
        with CheckpointClient(again.unix_target) as c:
            assert b"".join(c.get_blob(reply.sha256)) == blob
    finally:
        assert again.stop() == 0, again.log()


def test_a_get_blob_under_way_at_sigterm_sends_every_byte(tmp_path: Path) -> None:
    sidecar = start_sidecar(tmp_path / "data", *GRACE)
    blob = bytes(range(256)) * (4096 * 12)  # 12 MiB: twelve 1 MiB messages
    got: list[bytes] = []
    errors: list[object] = []
    try:
        with CheckpointClient(sidecar.unix_target) as c:
            c.put("a", b"\x08\x01")
            ref = c.put_blob(blob, session_id="a")
        with grpc.insecure_channel(
            sidecar.unix_target, options=[("grpc.max_receive_message_length", 4 << 20)]
        ) as channel:
            stub = service_pb2_grpc.CheckpointServiceStub(channel)
            first = threading.Event()

            def read() -> None:
                try:
                    for message in stub.GetBlob(
                        service_pb2.GetBlobRequest(sha256=ref.uri.rsplit(":", 1)[1]), timeout=60
                    ):
                        got.append(message.chunk)
                        first.set()
                        time.sleep(PAUSE_SECONDS)  # a slow reader: the stop arrives mid-stream
                except grpc.RpcError as exc:
                    errors.append((exc.code(), exc.details()))
                    first.set()

            reader = threading.Thread(target=read)
            reader.start()
            assert first.wait(10)
            sidecar.process.send_signal(signal.SIGTERM)
            reader.join(60)
        assert sidecar.process.wait(60) == 0, sidecar.log()
    finally:
        sidecar.stop(signal.SIGKILL)
    assert not errors, errors
    assert b"".join(got) == blob
