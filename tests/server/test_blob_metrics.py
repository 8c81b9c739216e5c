"""Blob calls in the metrics: PutBlob and GetBlob are served by the sidecar's gRPC process, not the store
process that serves /metrics, yet each counts there like any RPC (docs/operations.md, Metrics): a
request, an error by status code when it fails, and its latency."""

from __future__ import annotations

import functools
import hashlib
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from ckpt.sidecar.client import CheckpointClient, InvalidArgumentError, NotFoundError, ResourceExhaustedError
from ckpt.v1 import service_pb2, service_pb2_grpc
from tests.server.test_workers import clients_by_worker, start_workers
from tests.support import metrics_text, start_sidecar_with_metrics, wait_for_metrics

MISSING = "00" * 32


def samples(text: str, name: str) -> dict[str, float]:
    """``name``'s samples in a /metrics text, by their labels as written ('code="X",rpc="Y"')."""
    return {m[0]: float(m[1]) for m in re.findall(rf"^{re.escape(name)}\{{(.*)\}} (\S+)$", text, re.M)}


def test_blob_calls_count_their_requests_errors_by_code_and_latency(tmp_path: Path) -> None:
    sidecar = start_sidecar_with_metrics(tmp_path / "data", "--max-blob-bytes", "1000")
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            ref = client.put_blob(b"ok" * 10, session_id="s")
            assert b"".join(client.get_blob(ref)) == b"ok" * 10
            with pytest.raises(NotFoundError):
                b"".join(client.get_blob(MISSING))
            with pytest.raises(InvalidArgumentError):
                b"".join(client.get_blob(ref, offset=1000))  # past its end
            with pytest.raises(ResourceExhaustedError):
                client.put_blob(b"y" * 5000, session_id="s")
            with pytest.raises(InvalidArgumentError):
                client.put_blob(b"z", session_id="s", expected_sha256=hashlib.sha256(b"other").hexdigest())

        # The calls reach the metrics in the order they ended: once the last is there, all are.
        last = 'code="INVALID_ARGUMENT",rpc="PutBlob"'
        wait_for_metrics(lambda: last in samples(metrics_text(sidecar), "ckpt_errors_total"))
        text = metrics_text(sidecar)
        requests = samples(text, "ckpt_requests_total")
        assert (requests['rpc="PutBlob"'], requests['rpc="GetBlob"']) == (3, 3), text
        errors = {k: v for k, v in samples(text, "ckpt_errors_total").items() if "Blob" in k}
        assert errors == {
            'code="NOT_FOUND",rpc="GetBlob"': 1,
            'code="INVALID_ARGUMENT",rpc="GetBlob"': 1,
            'code="RESOURCE_EXHAUSTED",rpc="PutBlob"': 1,
            'code="INVALID_ARGUMENT",rpc="PutBlob"': 1,
        }, text
        seconds = samples(text, "ckpt_request_seconds_count")
        assert (seconds['rpc="PutBlob"'], seconds['rpc="GetBlob"']) == (3, 3), text
        assert samples(text, "ckpt_request_seconds_sum")['rpc="PutBlob"'] > 0
    finally:
        assert sidecar.stop() == 0, sidecar.log()


def test_each_worker_counts_the_blob_calls_it_serves(tmp_path: Path) -> None:
    sidecar, metrics = start_workers(tmp_path / "data")
    by_worker = clients_by_worker(sidecar.targets[0], metrics)
    try:
        assert all(by_worker), f"every connection landed on one worker: {[len(c) for c in by_worker]}"
        for worker, clients in enumerate(by_worker):
            client = clients[0]
            ref = client.put_blob(f"from worker {worker}".encode(), session_id=f"w{worker}")
            b"".join(client.get_blob(ref))
            with pytest.raises(NotFoundError):
                b"".join(client.get_blob(MISSING))

        def text(address: str) -> str:
            return str(urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode())

        def counted_a_miss(address: str) -> bool:
            return 'code="NOT_FOUND",rpc="GetBlob"' in samples(text(address), "ckpt_errors_total")

        for address in metrics:
            wait_for_metrics(functools.partial(counted_a_miss, address))
            requests = samples(text(address), "ckpt_requests_total")
            assert (requests['rpc="PutBlob"'], requests['rpc="GetBlob"']) == (1, 2), address
    finally:
        for clients in by_worker:
            for c in clients:
                c.close()
        assert sidecar.stop() == 0, sidecar.log()


def test_blob_calls_the_client_gave_up_on_count_as_cancelled_or_past_their_deadline(tmp_path: Path) -> None:
    sidecar = start_sidecar_with_metrics(tmp_path / "data")
    try:
        with grpc.insecure_channel(sidecar.unix_target) as channel:
            stub = service_pb2_grpc.CheckpointServiceStub(channel)
            sent = threading.Event()

            def half_sent(wait: float) -> Iterator[service_pb2.PutBlobRequest]:
                yield service_pb2.PutBlobRequest(session_id="s", chunk=b"a" * 1000)
                sent.set()
                time.sleep(wait)  # the rest never sent

            cancelled = stub.PutBlob.future(half_sent(1.0))
            assert sent.wait(10)
            time.sleep(0.2)  # the first message read
            cancelled.cancel()
            with pytest.raises(grpc.RpcError) as late:
                stub.PutBlob(half_sent(1.0), timeout=0.3)
            assert late.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            whole = [service_pb2.PutBlobRequest(session_id="s", chunk=b"b" * (8 << 20), end=True)]
            reading = stub.GetBlob(service_pb2.GetBlobRequest(sha256=stub.PutBlob(iter(whole)).sha256))
            next(reading)
            reading.cancel()

        expected = {
            'code="CANCELLED",rpc="PutBlob"': 1,
            'code="DEADLINE_EXCEEDED",rpc="PutBlob"': 1,
            'code="CANCELLED",rpc="GetBlob"': 1,
        }
        wait_for_metrics(lambda: samples(metrics_text(sidecar), "ckpt_errors_total") == expected)
    finally:
        assert sidecar.stop() == 0, sidecar.log()
