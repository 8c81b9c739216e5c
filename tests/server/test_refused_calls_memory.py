"""A refused call's request is freed when the call ends, in both of the sidecar's processes, not kept until
the collector runs: a client retrying a large write that keeps losing its compare-and-set must not grow the
sidecar by the write's size each time."""

from __future__ import annotations

import os
import re
from pathlib import Path

import grpc

from ckpt.v1 import service_pb2, service_pb2_grpc
from tests.server.test_store_process import _store_process
from tests.support import start_sidecar

STATE_BYTES = 16 << 20
REFUSED = 24  # kept, they would be ~400 MiB in each process


def _rss_mib(pid: int) -> int:
    found = re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text())
    assert found is not None
    return int(found.group(1)) // 1024


def test_refused_large_puts_and_appends_leave_neither_process_holding_them(tmp_path: Path) -> None:
    sidecar = start_sidecar(tmp_path / "data")
    try:
        store_pid = _store_process(sidecar)
        limit = [("grpc.max_send_message_length", 64 << 20)]
        with grpc.insecure_channel(sidecar.unix_target, options=limit) as channel:
            stub = service_pb2_grpc.CheckpointServiceStub(channel)
            stub.Put(service_pb2.PutRequest(session_id="s", state=b"\x08\x01"))
            state = os.urandom(STATE_BYTES)
            stub.Put(service_pb2.PutRequest(session_id="warm", state=state))  # buffers of this size exist once
            before = (_rss_mib(sidecar.pid), _rss_mib(store_pid))
            codes = set()
            for i in range(REFUSED):
                stale = service_pb2.PutRequest(session_id="s", state=state, expected_version=0)
                try:
                    if i % 2:
                        stub.Put(stale)
                    else:
                        event = service_pb2.Event(type="big", payload=state)
                        stub.AppendEvents(service_pb2.AppendEventsRequest(session_id="s", events=[event], put=stale))
                except grpc.RpcError as exc:
                    codes.add(exc.code())
            after = (_rss_mib(sidecar.pid), _rss_mib(store_pid))
            assert codes == {grpc.StatusCode.ABORTED}
            assert stub.Get(service_pb2.GetRequest(session_id="s")).version == 1
        grown = [a - b for a, b in zip(after, before, strict=True)]
        # Each process may keep a few requests' buffers (in flight, or reused by its allocator), never each.
        assert max(grown) < 6 * STATE_BYTES >> 20, (before, after)
    finally:
        sidecar.stop()
