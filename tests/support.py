"""What tests of several subjects share: a real `ckpt serve` to talk to, the `ckpt` command run as a user
runs it, and an LMDB data file's pages found and damaged byte by byte (LMDB 0.9, 64-bit)."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import lmdb
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

from ckpt.sidecar.server.process import SidecarProcess, start_sidecar_process
from ckpt.v1 import service_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Sidecar(SidecarProcess):
    """A sidecar listening on a unix socket and a TCP port."""

    @property
    def unix_target(self) -> str:
        return self.targets[0]

    @property
    def tcp_target(self) -> str:
        return self.targets[1]


def start_sidecar(data_dir: Path, *extra: str, socket_path: Path | None = None, port: int | None = None) -> Sidecar:
    socket_path = socket_path or data_dir.parent / f"{data_dir.name}.sock"
    # The log sits beside the data directory, which tests inspect and delete.
    log_path = data_dir.parent / f"{data_dir.name}-{time.monotonic_ns()}.log"
    listen = [f"unix:{socket_path}", f"127.0.0.1:{port or free_port()}"]
    p = start_sidecar_process(data_dir, *extra, listen=listen, log_path=log_path)
    return Sidecar(p.process, p.data_dir, p.targets, p.log_path)


def start_sidecar_sweeping(data_dir: Path, sweep_seconds: float, *extra: str) -> Sidecar:
    """A real `ckpt serve` on a unix socket and a TCP port whose sweeper runs every ``sweep_seconds``."""
    return start_sidecar(data_dir, "--sweep-interval-seconds", str(sweep_seconds), *extra)


def metrics_text(sidecar: Sidecar) -> str:
    """The sidecar's /metrics (started with --metrics-port, kept as ``sidecar.metrics_port``)."""
    port = sidecar.metrics_port  # type: ignore[attr-defined]
    text: str = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return text


def start_sidecar_with_metrics(data_dir: Path, *extra: str) -> Sidecar:
    """start_sidecar serving /metrics on a free port, kept as ``sidecar.metrics_port`` (for metric())."""
    port = free_port()
    sidecar = start_sidecar(data_dir, "--metrics-port", str(port), *extra)
    sidecar.metrics_port = port  # type: ignore[attr-defined]
    return sidecar


@contextlib.contextmanager
def metered_sidecar(data_dir: Path, *extra: str) -> Iterator[Sidecar]:
    """start_sidecar_with_metrics for a with block (a module's fixture): stopped after it, cleanly (exit 0)
    unless the block raised."""
    sidecar = start_sidecar_with_metrics(data_dir, *extra)
    try:
        yield sidecar
    except BaseException:
        sidecar.stop()
        raise
    assert sidecar.stop() == 0, sidecar.log()


@contextlib.contextmanager
def checkpoint_stub(target: str) -> Iterator[service_pb2_grpc.CheckpointServiceStub]:
    """A CheckpointService stub on its own insecure channel to ``target``, closed after the block."""
    with grpc.insecure_channel(target) as channel:
        yield service_pb2_grpc.CheckpointServiceStub(channel)


def wait_for_metrics(predicate: Callable[[], bool], timeout_seconds: float = 5.0) -> None:
    """Wait for ``predicate`` over /metrics: calls the gRPC process answers itself reach the store process's
    metrics over the link a moment after their replies (storelink.SERVED_REPORT_SECONDS)."""
    deadline = time.monotonic() + timeout_seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the metrics")
        time.sleep(0.02)


def metric(sidecar: Sidecar, name: str, *, missing: float | None = None) -> float:
    """One sample of the sidecar's /metrics (see metrics_text); ``missing``: the value of a sample not
    there yet (a labelled series appears at its first observation), else the sample must be there."""
    text = metrics_text(sidecar)
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    if found is None and missing is not None:
        return missing
    assert found, text
    return float(found.group(1))


# -- the `ckpt` command ---------------------------------------------------------


def ckpt(*args: str, stdin: bytes = b"", env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "ckpt.sidecar.cli", *args],
        input=stdin,
        capture_output=True,
        cwd=ROOT,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


# -- what a process imports ------------------------------------------------------

#: What a client process never runs: the store engine, the server, the tools, the codec's encoder and
#: decoder, LMDB. A module is one of them if it is one of these or inside one.
ENGINE_MODULES = (
    "ckpt.sidecar.store",
    "ckpt.sidecar.server",
    "ckpt.sidecar.tools",
    "ckpt.codec.encoder",
    "ckpt.codec.decoder",
    "lmdb",
)


def engine_modules(modules: set[str]) -> list[str]:
    """Those of ``modules`` that are ENGINE_MODULES or inside one."""
    return sorted(m for m in modules if any(m == e or m.startswith(e + ".") for e in ENGINE_MODULES))


def run_fresh(code: str, *args: str, stdin: bytes = b"") -> tuple[subprocess.CompletedProcess[bytes], set[str]]:
    """Run ``code`` in a new interpreter (from the project root, ``args`` as its sys.argv[1:]), and the
    names of every module it had imported when it ended, however it ended (sys.exit included)."""
    with tempfile.TemporaryDirectory() as tmp:
        listing = Path(tmp) / "modules"
        script = "\n".join(
            [
                "import sys",
                "_listing = sys.argv.pop(1)",
                "try:",
                *("    " + line for line in code.splitlines()),
                "finally:",
                "    with open(_listing, 'w') as _f:",
                "        _f.write('\\n'.join(sorted(sys.modules)))",
            ]
        )
        done = subprocess.run(
            [sys.executable, "-c", script, str(listing), *args],
            input=stdin,
            capture_output=True,
            cwd=ROOT,
            timeout=60,
        )
        assert listing.exists(), done.stderr.decode()
        return done, set(listing.read_text().split("\n"))


# -- LMDB pages ------------------------------------------------------------------

# LMDB page layout: a 16-byte header (pgno u64, pad u16, flags u16, lower u16, upper u16), then
# u16 offsets of the nodes; a node is lo u16, hi u16, flags u16, key size u16, key, data.
HEADER = 16
P_BRANCH, P_LEAF = 0x01, 0x02
# LMDB's assertions, as it prints them (the line numbers are the bundled mdb.c's).
IS_LEAF = r"mdb\.c:\d+: Assertion 'IS_LEAF\(mp\)' failed in mdb_cursor_next\(\)"
NUMKEYS = r"mdb\.c:\d+: Assertion '!mc->mc_dbi \|\| NUMKEYS\(mp\) > 1' failed in mdb_page_search_root\(\)"


class Pages:
    """data.mdb's pages, to find and damage a table's branch and leaf pages."""

    def __init__(self, data: Path) -> None:
        self.path = data / "lmdb" / "data.mdb"
        env = lmdb.open(str(data / "lmdb"), max_dbs=8, readonly=True, lock=False)
        with env.begin() as txn:
            self.records = {name: txn.get(name.encode()) for name in ("frames", "sessions")}
        self.psize = env.stat()["psize"]
        env.close()
        self.buf = bytearray(self.path.read_bytes())

    def root(self, table: str) -> int:
        return int(struct.unpack_from("<Q", self.records[table] or b"", 40)[0])  # md_root of its MDB_db record

    def flags(self, pgno: int) -> int:
        return int(struct.unpack_from("<H", self.buf, pgno * self.psize + 10)[0])

    def nodes(self, pgno: int) -> list[tuple[int, int, bytes]]:
        """(offset of the node in its page, child page number for a branch, key) for each node."""
        base = pgno * self.psize
        lower = struct.unpack_from("<H", self.buf, base + 12)[0]
        out = []
        for i in range((lower - HEADER) // 2):
            offset = struct.unpack_from("<H", self.buf, base + HEADER + 2 * i)[0]
            lo, hi, flags, ksize = struct.unpack_from("<HHHH", self.buf, base + offset)
            key = bytes(self.buf[base + offset + 8 : base + offset + 8 + ksize])
            out.append((offset, lo | hi << 16 | flags << 32, key))
        return out

    def leaves(self, table: str) -> list[tuple[int, list[bytes]]]:
        """The table's leaf pages in key order, with their keys (the root must be a branch over leaves)."""
        root = self.root(table)
        assert self.flags(root) & P_BRANCH, f"{table}: the root is not a branch"
        out = []
        for _, child, _ in self.nodes(root):
            assert self.flags(child) & P_LEAF, f"{table}: more than two levels"
            out.append((child, [key for _, _, key in self.nodes(child)]))
        assert len(out) >= 3, f"{table} has {len(out)} leaves"
        return out

    def put(self, pgno: int, offset: int, fmt: str, value: int) -> None:
        struct.pack_into(fmt, self.buf, pgno * self.psize + offset, value)

    def write(self) -> None:
        self.path.write_bytes(self.buf)


# -- a client's own message type ----------------------------------------------------------

_F = descriptor_pb2.FieldDescriptorProto
#: The agent state type of the typed-session tests, as a client registers it.
AGENT_STATE = "acme.agent.v1.State"


def agent_file(*, summary: bool = False, log_type: int = _F.TYPE_STRING) -> descriptor_pb2.FileDescriptorProto:
    """acme/agent/v1/state.proto, built by hand as protoc would describe it:

        message Entity { string name = 1; int64 score = 2; Note note = 3; message Note { string text = 1; } }
        message State {
          map<string, Entity> entities = 1;  // edited in place
          repeated string log = 2;           // grows
          optional int32 step = 3;           // may be set back to 0
          Entity.Note last = 4;
          string summary = 5;                // with summary=True: a compatible change
        }

    ``log_type`` gives field 2 another type: an incompatible change.
    """
    f = descriptor_pb2.FileDescriptorProto(name="acme/agent/v1/state.proto", package="acme.agent.v1", syntax="proto3")
    entity = f.message_type.add(name="Entity")
    entity.field.add(name="name", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    entity.field.add(name="score", number=2, type=_F.TYPE_INT64, label=_F.LABEL_OPTIONAL)
    note = entity.nested_type.add(name="Note")
    note.field.add(name="text", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    entity.field.add(
        name="note", number=3, type=_F.TYPE_MESSAGE, type_name=".acme.agent.v1.Entity.Note", label=_F.LABEL_OPTIONAL
    )
    state = f.message_type.add(name="State")
    entry = state.nested_type.add(name="EntitiesEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    entry.field.add(
        name="value", number=2, type=_F.TYPE_MESSAGE, type_name=".acme.agent.v1.Entity", label=_F.LABEL_OPTIONAL
    )
    state.field.add(
        name="entities",
        number=1,
        type=_F.TYPE_MESSAGE,
        type_name=".acme.agent.v1.State.EntitiesEntry",
        label=_F.LABEL_REPEATED,
    )
    state.field.add(name="log", number=2, type=log_type, label=_F.LABEL_REPEATED)
    state.oneof_decl.add(name="_step")
    state.field.add(
        name="step", number=3, type=_F.TYPE_INT32, label=_F.LABEL_OPTIONAL, oneof_index=0, proto3_optional=True
    )
    state.field.add(
        name="last", number=4, type=_F.TYPE_MESSAGE, type_name=".acme.agent.v1.Entity.Note", label=_F.LABEL_OPTIONAL
    )
    if summary:
        state.field.add(name="summary", number=5, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    return f


def descriptor_set_of(*files: descriptor_pb2.FileDescriptorProto) -> bytes:
    return descriptor_pb2.FileDescriptorSet(file=list(files)).SerializeToString()


def agent_state_class(f: descriptor_pb2.FileDescriptorProto | None = None) -> Any:
    """acme.agent.v1.State's class (of ``f``, default agent_file()), from a pool of its own (a dynamic
    class: its fields are typed Any)."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f or agent_file())
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(AGENT_STATE))


def agent_step(state_class: Any, step: int) -> Any:
    """One step's MERGE patch: entity "e1" rewritten in place (same size every step), a log line appended,
    the step set."""
    patch = state_class()
    entity = patch.entities["e1"]
    entity.name = f"entity revision {step:04d} " + "x" * 200
    entity.score = step
    patch.log.append(f"step {step}")
    patch.step = step
    return patch


#: A proto2 type whose second version adds a closed enum's value and a oneof member: what version 1 reads
#: as unknown fields (at the top, in a sub-message, a map's entries whole) is known to version 2.
EVOLVING_STATE = "evolve.S"
_EVOLVING = """
name: "evolve/s.proto" package: "evolve" syntax: "proto2"
enum_type { name: "Color" value { name: "NONE" number: 0 } value { name: "RED" number: 1 } %(blue)s }
message_type {
  name: "Sub"
  field { name: "a" number: 1 label: LABEL_OPTIONAL type: TYPE_INT32 }
  field { name: "c" number: 2 label: LABEL_OPTIONAL type: TYPE_ENUM type_name: ".evolve.Color" }
}
message_type {
  name: "S"
  field { name: "color" number: 1 label: LABEL_OPTIONAL type: TYPE_ENUM type_name: ".evolve.Color" }
  field { name: "ostr" number: 2 label: LABEL_OPTIONAL type: TYPE_STRING oneof_index: 0 }
  field { name: "osub" number: 3 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".evolve.Sub" oneof_index: 0 }
  %(onew)s
  field { name: "sub" number: 4 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".evolve.Sub" }
  field { name: "cmap" number: 5 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".evolve.S.CmapEntry" }
  field { name: "note" number: 6 label: LABEL_OPTIONAL type: TYPE_STRING }
  nested_type {
    name: "CmapEntry" options { map_entry: true }
    field { name: "key" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
    field { name: "value" number: 2 label: LABEL_OPTIONAL type: TYPE_ENUM type_name: ".evolve.Color" }
  }
  oneof_decl { name: "choice" }
}
"""


def evolving_file(version: int) -> descriptor_pb2.FileDescriptorProto:
    """evolve/s.proto, version 1 or 2 (2 adds ``BLUE = 99`` to Color and ``int32 onew = 20`` to the oneof)."""
    v2 = version == 2
    text = _EVOLVING % {
        "blue": 'value { name: "BLUE" number: 99 }' if v2 else "",
        "onew": 'field { name: "onew" number: 20 label: LABEL_OPTIONAL type: TYPE_INT32 oneof_index: 0 }' if v2 else "",
    }
    return text_format.Parse(text, descriptor_pb2.FileDescriptorProto())


def evolving_state_class(version: int) -> Any:
    """evolve.S's class of ``version``, from a pool of its own."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(evolving_file(version))
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(EVOLVING_STATE))


# -- a field number removed, then given another type ---------------------------------------------

#: acme.State of NOTE_V1: step = 1, note (field 2, bytes) = b"\xff\xff", which is no well-formed acme.Sub.
NOTE_STATE = b"\x08\x01\x12\x02\xff\xff"


def numbered_file(*fields: tuple[str, int, int, str]) -> descriptor_pb2.FileDescriptorProto:
    """acme/r.proto: message Sub { int32 n = 1; } and message State with ``fields`` (name, number, type,
    type name)."""
    f = descriptor_pb2.FileDescriptorProto(name="acme/r.proto", package="acme", syntax="proto3")
    f.message_type.add(name="Sub").field.add(name="n", number=1, type=_F.TYPE_INT32, label=_F.LABEL_OPTIONAL)
    state = f.message_type.add(name="State")
    for name, number, type_, type_name in fields:
        field = state.field.add(name=name, number=number, type=type_, label=_F.LABEL_OPTIONAL)
        if type_name:
            field.type_name = type_name
    return f


STEP_FIELD = ("step", 1, _F.TYPE_INT32, "")
NOTE_FIELD = ("note", 2, _F.TYPE_BYTES, "")
NOTE_V1 = numbered_file(STEP_FIELD, NOTE_FIELD)
NOTE_REMOVED = numbered_file(STEP_FIELD)  # note removed
DETAIL_FIELD = ("detail", 2, _F.TYPE_MESSAGE, ".acme.Sub")
NOTE_AS_MESSAGE = numbered_file(STEP_FIELD, DETAIL_FIELD)  # number 2 again, as a message


def edit_meta_and_types(data: Path, *, delete: bytes = b"", put_types: dict[bytes, bytes] | None = None) -> None:
    """Change a closed store's LMDB as an earlier ckpt could have left it."""
    env = lmdb.open(str(data / "lmdb"), max_dbs=16)
    try:
        meta, types = env.open_db(b"meta"), env.open_db(b"types")
        with env.begin(write=True) as txn:
            if delete:
                assert txn.delete(delete, db=meta)
            for key, value in (put_types or {}).items():
                txn.put(key, value, db=types)
    finally:
        env.close()
