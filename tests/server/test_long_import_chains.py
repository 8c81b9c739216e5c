"""A type whose files import each other in a long chain, through a real `ckpt serve`: registered in either
order, and the store it was registered in opens again, serves the type and verifies clean."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2

from ckpt.v1 import service_pb2, service_pb2_grpc
from tests.support import ckpt, start_sidecar

F = descriptor_pb2.FieldDescriptorProto
FILES = 1000  # deeper than Python's recursion limit


def import_chain(n: int, *, head_first: bool) -> bytes:
    """A set of ``n`` files, f00000.proto importing f00001.proto importing ... f{n-1}.proto, each defining pN.M
    {int64 x = 1}; sent from the chain's head (f00000.proto) or from its end."""
    files = []
    for i in range(n):
        f = descriptor_pb2.FileDescriptorProto(name=f"f{i:05d}.proto", package=f"p{i}", syntax="proto3")
        if i + 1 < n:
            f.dependency.append(f"f{i + 1:05d}.proto")
        f.message_type.add(name="M").field.add(name="x", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
        files.append(f)
    return descriptor_pb2.FileDescriptorSet(file=files if head_first else files[::-1]).SerializeToString()


@pytest.mark.parametrize("head_first", [False, True], ids=["sent-last-first", "sent-first-first"])
def test_a_thousand_file_import_chain_registers_and_its_store_opens_serves_and_verifies_again(
    tmp_path: Path, head_first: bool
) -> None:
    data = tmp_path / "data"
    sidecar = start_sidecar(data)
    try:
        with grpc.insecure_channel(sidecar.unix_target) as channel:
            stub = service_pb2_grpc.CheckpointServiceStub(channel)
            stub.Put(service_pb2.PutRequest(session_id="precious", state=b"agent state"), timeout=30)
            registered = stub.RegisterType(
                service_pb2.RegisterTypeRequest(file_descriptor_set=import_chain(FILES, head_first=head_first)),
                timeout=60,
            )
            assert sorted(registered.message_types) == sorted(f"p{i}.M" for i in range(FILES))
    finally:
        assert sidecar.stop() == 0, sidecar.log()
    sidecar = start_sidecar(data)
    try:
        assert "typed sessions cannot be written" not in sidecar.log()
        with grpc.insecure_channel(sidecar.unix_target) as channel:
            stub = service_pb2_grpc.CheckpointServiceStub(channel)
            assert stub.Get(service_pb2.GetRequest(session_id="precious"), timeout=30).state == b"agent state"
            for name in ("p0.M", f"p{FILES - 1}.M"):
                put = service_pb2.PutRequest(session_id=name, state=b"\x08\x07", message_type=name)
                assert stub.Put(put, timeout=30).version == 1
                got = stub.Get(service_pb2.GetRequest(session_id=name), timeout=30)
                assert (got.state, got.message_type) == (b"\x08\x07", name)
            # Still a typed session: a state that does not parse as the type is refused.
            bad = service_pb2.PutRequest(session_id="p0.M", state=b"\x08\xff")
            with pytest.raises(grpc.RpcError) as refused:
                stub.Put(bad, timeout=30)
            assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT, refused.value
    finally:
        assert sidecar.stop() == 0, sidecar.log()
    verify = ckpt("verify", "--data-dir", str(data))
    assert verify.returncode == 0, verify.stdout + verify.stderr
