"""The Node client registers a type from its .proto file as protoc would (the Python clients): each file in
its own syntax, against a real sidecar. proto2 files (explicit presence, defaults, required fields),
proto3 `optional` fields beside a oneof, extensions: registered from Node, merged into by typed patches,
read back whole and through a field mask (which the sidecar applies with the registered type), parsed
as protoc's message."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import lmdb
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from ckpt.sidecar import descriptors
from tests.client.test_node_client import node_command
from tests.support import start_sidecar

# Registers the type of a .proto file under protoc's name for the file, merges typed patches into one
# session, and prints what it registered and the state it reads back, whole and through a field mask.
_REGISTER_AND_MERGE = """
const path = require('path');
const { CheckpointClient } = require(process.argv[1]);
const protobuf = require(require.resolve('protobufjs', { paths: [path.dirname(process.argv[1])] }));
const [target, protoFile, typeName, fileName, patches, mask] = process.argv.slice(2);
(async () => {
  const root = new protobuf.Root().loadSync(protoFile, { keepCase: true });
  const Type = root.lookupType(typeName);
  const client = new CheckpointClient(target);
  try {
    const registered = await client.registerType(root, typeName, { fileName });
    for (const patch of JSON.parse(patches)) {
      await client.merge('typed', Type.encode(Type.fromObject(patch)).finish(), { messageType: typeName });
    }
    const got = await client.get('typed');
    const masked = await client.get('typed', 0, { fieldMask: JSON.parse(mask) });
    const base64 = (b) => Buffer.from(b).toString('base64');
    console.log(JSON.stringify({ registered, message_type: got.message_type, state: base64(got.state),
      masked: base64(masked.state) }));
  } finally {
    client.close();
  }
})().catch((err) => { console.error(err); process.exit(1); });
"""


def _protoc(tmp_path: Path, name: str, text: str) -> descriptor_pb2.FileDescriptorProto:
    """protoc's FileDescriptorProto for ``text`` as the file ``name``."""
    (tmp_path / "protos" / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "protos" / name).write_text(text)
    out = tmp_path / "protoc.pb"
    args = ["-m", "grpc_tools.protoc", f"-I{tmp_path / 'protos'}", f"--descriptor_set_out={out}", name]
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]


def _stored_file(data: Path, name: str) -> descriptor_pb2.FileDescriptorProto:
    """The file ``name`` as a sidecar's store keeps it registered."""
    env = lmdb.open(str(data / "lmdb"), max_dbs=8, readonly=True)
    try:
        with env.begin() as txn:
            raw = txn.get(name.encode(), db=env.open_db(b"types", txn=txn, create=False))
    finally:
        env.close()
    assert raw is not None, f"{name} is not registered"
    return descriptor_pb2.FileDescriptorProto.FromString(raw)


class _Registered:
    """What Node registered and read back, its states parsed as protoc's message ``type_name``."""

    def __init__(self, out: dict[str, Any], protoc_file: descriptor_pb2.FileDescriptorProto, type_name: str) -> None:
        self.pool = descriptor_pool.DescriptorPool()
        self.pool.Add(protoc_file)
        self.message_class = message_factory.GetMessageClass(self.pool.FindMessageTypeByName(type_name))
        self.registered: list[str] = out["registered"]
        self.message_type: str = out["message_type"]
        # Any: messages of classes made at run time, their fields unknown to mypy.
        self.state: Any = self.message_class.FromString(base64.b64decode(out["state"]))
        self.masked: Any = self.message_class.FromString(base64.b64decode(out["masked"]))

    def message(self, type_name: str = "", **fields: Any) -> Any:
        """A message of the type read (or of ``type_name``) as protoc's file defines it."""
        if not type_name:
            return self.message_class(**fields)
        return message_factory.GetMessageClass(self.pool.FindMessageTypeByName(type_name))(**fields)

    def extension(self, name: str) -> Any:
        return self.pool.FindExtensionByName(name)


def _register_and_merge(
    tmp_path: Path, name: str, text: str, type_name: str, patches: list[dict[str, Any]], mask: list[str]
) -> _Registered:
    """Registers ``text`` from Node as the file ``name`` and merges ``patches`` (protobufjs objects); the
    file the sidecar keeps is asserted to define what protoc's does."""
    protoc_file = _protoc(tmp_path, name, text)
    sidecar = start_sidecar(tmp_path / "data")
    try:
        args = (sidecar.unix_target, str(tmp_path / "protos" / name), type_name, name, json.dumps(patches))
        command = node_command(_REGISTER_AND_MERGE, *args, json.dumps(mask))
        proc = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
    finally:
        assert sidecar.stop() == 0
    assert descriptors.definition(_stored_file(tmp_path / "data", name)) == descriptors.definition(protoc_file)
    return _Registered(json.loads(proc.stdout), protoc_file, type_name)


_PROTO2 = """syntax = "proto2";
package acme.legacy;
enum Phase { START = 1; DONE = 2; }
message State {
  required int32 id = 1;
  optional int32 retries = 2 [default = 3];
  optional string name = 3;
  optional Phase phase = 4 [default = DONE];
  repeated int32 ids = 5 [packed = true];
  optional float ratio = 6 [default = 0.3333333];
}
"""


def test_node_registers_a_proto2_file_with_its_presence_defaults_and_required_fields(tmp_path: Path) -> None:
    patches = [{"id": 1, "retries": 5, "name": "a", "ids": [1]}, {"id": 1, "retries": 0, "ids": [2]}]
    name = "acme/legacy/state.proto"
    got = _register_and_merge(tmp_path, name, _PROTO2, "acme.legacy.State", patches, ["retries"])
    assert got.registered == ["acme.legacy.State"]
    assert got.message_type == "acme.legacy.State"
    assert got.state == got.message(id=1, retries=0, name="a", ids=[1, 2])
    assert not got.state.HasField("phase") and got.state.phase == 2  # unset: the file's default, DONE
    # The sidecar's own parse keeps proto2's presence: the masked state still sets retries to 0.
    assert got.masked == got.message(retries=0) and got.masked.HasField("retries")


_OPTIONAL_AND_ONEOF = """syntax = "proto3";
package acme.choice;
message Item { string label = 1; }
message State {
  optional int32 step = 1;
  oneof choice { string text = 2; Item item = 3; }
  optional string note = 4;
  int32 count = 5;
}
"""


def test_node_registers_proto3_optional_fields_beside_a_oneof(tmp_path: Path) -> None:
    patches = [{"step": 4, "text": "x", "note": "n", "count": 2}, {"step": 0, "item": {"label": "y"}}]
    name = "acme/choice/state.proto"
    got = _register_and_merge(tmp_path, name, _OPTIONAL_AND_ONEOF, "acme.choice.State", patches, ["step", "item"])
    assert got.registered == ["acme.choice.Item", "acme.choice.State"]
    item = got.message("acme.choice.Item", label="y")
    # The oneof holds the last patch's choice; step's 0 is set (it has presence).
    assert got.state == got.message(step=0, item=item, note="n", count=2)
    assert got.state.HasField("step") and got.state.WhichOneof("choice") == "item"
    assert got.masked == got.message(step=0, item=item) and got.masked.HasField("step")


_EXTENSION = """syntax = "proto2";
package acme.ext;
message Tag { optional string key = 1; optional string value = 2; }
message State {
  optional int32 step = 1;
  extensions 100 to 199;
}
extend State {
  optional Tag tag = 100;
  repeated int32 marks = 101;
}
"""


def test_node_registers_a_proto2_file_with_extensions(tmp_path: Path) -> None:
    patches: list[dict[str, Any]] = [
        {"step": 1, ".acme.ext.tag": {"key": "k"}, ".acme.ext.marks": [1]},
        {".acme.ext.tag": {"value": "v"}, ".acme.ext.marks": [2]},
    ]
    got = _register_and_merge(tmp_path, "acme/ext/state.proto", _EXTENSION, "acme.ext.State", patches, ["step"])
    assert got.registered == ["acme.ext.State", "acme.ext.Tag"]
    tag, marks = got.extension("acme.ext.tag"), got.extension("acme.ext.marks")
    want = got.message(step=1)
    want.Extensions[tag].key, want.Extensions[tag].value = "k", "v"  # the patches' tags merged
    want.Extensions[marks].extend([1, 2])
    assert got.state == want
    assert got.masked == got.message(step=1)


_EDITION = """edition = "2023";
package acme.ed;
message State { int32 step = 1; }
"""

_REGISTER_ONLY = """
const path = require('path');
const { CheckpointClient } = require(process.argv[1]);
const protobuf = require(require.resolve('protobufjs', { paths: [path.dirname(process.argv[1])] }));
const [protoFile, typeName] = process.argv.slice(2);
const client = new CheckpointClient('unix:/nonexistent/ckpt.sock', { timeoutMs: 2000, retries: 0 });
client.registerType(protobuf.loadSync(protoFile), typeName).then(
  (registered) => console.log(JSON.stringify({ registered })),
  (err) => console.log(JSON.stringify({ error: err.message, code: err.code === undefined ? null : err.code })),
).finally(() => client.close());
"""


def test_node_refuses_to_register_an_editions_file_before_sending_it(tmp_path: Path) -> None:
    proto = tmp_path / "ed.proto"
    proto.write_text(_EDITION)
    proc = subprocess.run(
        node_command(_REGISTER_ONLY, str(proto), "acme.ed.State"), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["code"] is None, out  # refused by the client, not a gRPC error from an unreachable sidecar
    assert "takes proto2 and proto3 files: acme.ed.State is from an edition 2023 file" in out["error"]
