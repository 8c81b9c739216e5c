"""The .proto files are the whole contract for a client in another language: what a
Go, Rust or Java developer reads (or gets by server reflection) must name the
limits the sidecar enforces and where a conflict's head is, machine-readably.

The comments used to leave out the label limits, the request id's rules (its
lifetime, a reuse for another write), the size limit of a state and the
`ckpt-current-version` trailer: the Put rpc said only that "the message names
the current head", which a program would have to parse out of English.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from ckpt.sidecar import config
from ckpt.sidecar.status import STATUS_OF
from ckpt.sidecar.store import keys
from tests.support import ROOT, Sidecar, start_sidecar

SERVICE_PROTO = "ckpt/v1/service.proto"


def _comments() -> dict[str, str]:
    """Leading comment of each element of service.proto, by name: "Service", "Service.Rpc",
    "Message", "Message.field", "Enum"."""
    from grpc_tools import protoc  # dev-only dependency, as scripts/gen_stubs.py uses it

    well_known = resources.files("grpc_tools") / "_proto"
    args = ["protoc", f"-I{ROOT / 'proto'}", f"-I{well_known}", "--include_source_info"]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        assert protoc.main([*args, f"--descriptor_set_out={out}", SERVICE_PROTO]) == 0
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    (proto,) = (f for f in files.file if f.name == SERVICE_PROTO)
    names: dict[tuple[int, ...], str] = {}
    for i, service in enumerate(proto.service):
        names[(6, i)] = service.name
        for j, method in enumerate(service.method):
            names[(6, i, 2, j)] = f"{service.name}.{method.name}"
    for i, message in enumerate(proto.message_type):
        names[(4, i)] = message.name
        for j, field in enumerate(message.field):
            names[(4, i, 2, j)] = f"{message.name}.{field.name}"
    for i, enum in enumerate(proto.enum_type):
        names[(5, i)] = enum.name
    comments = {}
    for location in proto.source_code_info.location:
        name = names.get(tuple(location.path))
        if name is not None:
            comments[name] = " ".join(location.leading_comments.split())
    return comments


def _says(comment: str, *facts: object) -> None:
    for fact in facts:
        assert str(fact) in comment, f"{fact!r} is not in: {comment}"


def test_the_proto_states_the_limits_the_sidecar_enforces() -> None:
    c = _comments()
    _says(c["PutRequest.session_id"], f"1-{keys.MAX_SESSION_ID_BYTES} bytes", "control")
    _says(c["PutRequest.request_id"], f"{keys.MAX_REQUEST_ID_BYTES} bytes", "control", "INVALID_ARGUMENT")
    _says(c["PutRequest.request_id"], "--request-id-ttl-seconds", int(config.DEFAULT_REQUEST_ID_TTL_SECONDS))
    _says(
        c["PutRequest.labels"],
        f"{keys.MAX_LABELS} per write and {keys.MAX_LABELS} per session",
        f"1-{keys.MAX_LABEL_KEY_BYTES}",
        f"{keys.MAX_LABEL_VALUE_BYTES} bytes",
        "control",
    )
    _says(
        c["PutRequest.state"],
        "--max-message-bytes",
        f"{config.DEFAULT_MAX_MESSAGE_BYTES >> 20} MiB",
        f"less {config.MESSAGE_ENVELOPE_BYTES} bytes",
        "RESOURCE_EXHAUSTED",
    )
    _says(c["CheckpointService.Put"], "ABORTED", "ckpt-current-version")
    _says(c["VersionInfo.mode"], "Fork")
    # Neither is idempotent: what a retry after a lost reply gets.
    _says(c["CheckpointService.Fork"], "retry", "ALREADY_EXISTS")
    _says(c["CheckpointService.DeleteSession"], "retry", "NOT_FOUND")
    # Every status the sidecar maps a store error to is explained where the service is.
    for code in {*STATUS_OF.values()}:
        _says(c["CheckpointService"], code.name)


def test_buf_lint_requires_every_element_documented() -> None:
    lint = (ROOT / "buf.yaml").read_text()
    assert re.search(r"^\s+- COMMENTS\b", lint, re.M), lint


# A client that has nothing of ckpt but the sidecar's address: the service by reflection,
# messages from its descriptors, the head by the trailer key the Put rpc's comment names.


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    s = start_sidecar(tmp_path_factory.mktemp("proto-contract") / "data")
    yield s
    assert s.stop() == 0, s.log()


def test_a_reflection_client_finds_the_head_of_a_conflict_where_the_proto_says(sidecar: Sidecar) -> None:
    found = re.search(r"trailing metadata key `([a-z0-9-]+)`", _comments()["CheckpointService.Put"])
    assert found, "the Put rpc's comment names no trailer"
    key = found.group(1)
    with grpc.insecure_channel(sidecar.tcp_target) as channel:
        pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
        put = pool.FindServiceByName("ckpt.v1.CheckpointService").FindMethodByName("Put")
        request_class = message_factory.GetMessageClass(put.input_type)
        response_class = message_factory.GetMessageClass(put.output_type)
        call = channel.unary_unary(
            "/ckpt.v1.CheckpointService/Put",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_class.FromString,
        )

        def put_json(body: dict[str, object]) -> object:
            return call(json_format.ParseDict(body, request_class()), timeout=10)

        for _ in range(2):
            put_json({"session_id": "reflected", "state": "CAE="})
        for expected, head in (("1", "2"), ("0", "2")):
            with pytest.raises(grpc.RpcError) as info:
                put_json({"session_id": "reflected", "state": "CAE=", "expected_version": expected})
            err: grpc.Call = info.value
            assert err.code() is grpc.StatusCode.ABORTED
            assert dict(err.trailing_metadata() or ())[key] == head
        with pytest.raises(grpc.RpcError) as info:
            put_json({"session_id": "never-written", "state": "CAE=", "expected_version": "3"})
        missing: grpc.Call = info.value
        assert dict(missing.trailing_metadata() or ())[key] == "0"
