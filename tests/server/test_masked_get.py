"""Field-masked Gets (GetRequest.field_mask) through a real `ckpt serve`: the masked state, whichever
process answers (the gRPC process from its reply cache or its own read, or the store process), for the
latest and a given version; a masked reply never answers a Get of the whole state; and the
INVALID_ARGUMENT each bad mask gets."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, field_mask_pb2

from ckpt.sidecar.client import AsyncCheckpointClient, CheckpointClient, InvalidArgumentError, NotFoundError
from ckpt.sidecar.server.replycache import INLINE_READ_MAX_STATE_BYTES
from ckpt.v1 import checkpoint_pb2 as pb
from ckpt.v1 import service_pb2, service_pb2_grpc
from tests.support import (
    AGENT_STATE,
    agent_file,
    agent_state_class,
    agent_step,
    descriptor_set_of,
    free_port,
    metric,
    start_sidecar,
)

CHECKPOINT = "ckpt.v1.Checkpoint"
F = descriptor_pb2.FieldDescriptorProto


def _oracle(message_class: Any, state: bytes, paths: list[str]) -> Any:
    out = message_class()
    field_mask_pb2.FieldMask(paths=paths).MergeMessage(message_class.FromString(state), out)
    return out


def _patches(history_bytes: int) -> list[pb.Checkpoint]:
    """An agent's MERGE patches: a plan step and a handoff note revised as it goes, a long conversation."""
    patches = [pb.Checkpoint(schema_version=1, goal="fix the cache", status=pb.STATUS_RUNNING)]
    step = 0
    while sum(p.ByteSize() for p in patches) < history_bytes:
        step += 1
        patch = pb.Checkpoint(step=step, messages=[pb.Message(role=pb.ROLE_TOOL, content=f"{step} " + "o" * 4000)])
        patch.plan[f"s{step % 3}"].CopyFrom(pb.PlanStep(id=f"s{step % 3}", title=f"revision {step}"))
        if step % 2:
            patch.handoff.next = f"after step {step}"
        else:
            patch.handoff.decided = f"at step {step}"
        patches.append(patch)
    return patches


def _write(client: CheckpointClient, session: str, patches: list[pb.Checkpoint]) -> pb.Checkpoint:
    whole = pb.Checkpoint()
    for patch in patches:
        client.merge(session, message=patch)
        whole.MergeFrom(patch)
    return whole


def _masked(client: CheckpointClient, session: str, paths: list[str], version: int = 0) -> pb.Checkpoint:
    got = client.get(session, version, field_mask=paths)
    assert got.message_type == CHECKPOINT
    return pb.Checkpoint.FromString(got.state)


@pytest.mark.parametrize("reply_cache", [True, False], ids=["reply-cache", "forwarded"])
@pytest.mark.parametrize("history_bytes", [40_000, INLINE_READ_MAX_STATE_BYTES + 40_000], ids=["small", "large"])
def test_a_masked_get_holds_only_the_masked_fields_whichever_process_answers(
    tmp_path: Path, reply_cache: bool, history_bytes: int
) -> None:
    sidecar = start_sidecar(tmp_path / "data", *([] if reply_cache else ["--reply-cache-bytes", "0"]))
    paths = ["handoff", "plan", "status"]
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            patches = _patches(history_bytes)
            whole = _write(client, "agent", patches)
            # The first masked Get after a write (read in the gRPC process when small, else forwarded).
            first = _masked(client, "agent", paths)
            assert first == _oracle(pb.Checkpoint, whole.SerializeToString(), paths)
            assert first.handoff.next and first.handoff.decided and len(first.plan) == 3 and not first.messages
            # Not kept as the session's reply: a Get of the whole state gets all of it, then masked Gets
            # answered from that reply (when kept) are masked all the same.
            full = client.get("agent")
            assert pb.Checkpoint.FromString(full.state) == whole
            assert _masked(client, "agent", paths) == first
            assert _masked(client, "agent", ["handoff.next"]) == pb.Checkpoint(
                handoff=pb.Handoff(next=whole.handoff.next)
            )
            assert pb.Checkpoint.FromString(client.get("agent").state) == whole
            # A given version, older than the head.
            old = pb.Checkpoint()
            for patch in patches[:3]:
                old.MergeFrom(patch)
            assert _masked(client, "agent", paths, version=3) == _oracle(pb.Checkpoint, old.SerializeToString(), paths)
            # A write moves the head on: the next masked Get holds its change.
            client.merge("agent", message=pb.Checkpoint(handoff=pb.Handoff(next="ship it")))
            assert _masked(client, "agent", ["handoff"]).handoff.next == "ship it"
            assert pb.Checkpoint.FromString(client.get("agent").state).handoff.next == "ship it"
    finally:
        assert sidecar.stop() == 0, sidecar.log()


def test_the_grpc_process_keeps_masked_replies_apart_and_answers_repeated_masked_gets(tmp_path: Path) -> None:
    # A state too large for the gRPC process to read is masked by the store process once; the repeats
    # are answered from that masked reply until a write moves the head on.
    metrics_port = free_port()
    sidecar = start_sidecar(tmp_path / "data", "--metrics-port", str(metrics_port))
    sidecar.metrics_port = metrics_port  # type: ignore[attr-defined]
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            whole = _write(client, "agent", _patches(INLINE_READ_MAX_STATE_BYTES + 40_000))
            expected = pb.Checkpoint(handoff=whole.handoff, plan=whole.plan)
            assert _masked(client, "agent", ["handoff", "plan"]) == expected  # forwarded
            hits = metric(sidecar, "ckpt_reply_cache_hits_total")
            for _ in range(3):
                assert _masked(client, "agent", ["handoff", "plan"]) == expected
            _wait_for_metric(sidecar, "ckpt_reply_cache_hits_total", hits + 3)
            assert pb.Checkpoint.FromString(client.get("agent").state) == whole  # never the masked reply
            assert _masked(client, "agent", ["plan", "handoff"]) == expected  # another mask, another reply
            client.merge("agent", message=pb.Checkpoint(handoff=pb.Handoff(next="later")))
            assert _masked(client, "agent", ["handoff", "plan"]).handoff.next == "later"
    finally:
        assert sidecar.stop() == 0, sidecar.log()


def test_the_grpc_process_answers_masked_gets_from_the_whole_states_reply(tmp_path: Path) -> None:
    metrics_port = free_port()
    sidecar = start_sidecar(tmp_path / "data", "--metrics-port", str(metrics_port))
    sidecar.metrics_port = metrics_port  # type: ignore[attr-defined]
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            whole = _write(client, "agent", _patches(20_000))
            client.get("agent")  # read in the gRPC process, its reply kept
            hits = metric(sidecar, "ckpt_reply_cache_hits_total")
            for _ in range(3):
                assert _masked(client, "agent", ["plan"]) == pb.Checkpoint(plan=whole.plan)
            _wait_for_metric(sidecar, "ckpt_reply_cache_hits_total", hits + 3)
    finally:
        assert sidecar.stop() == 0, sidecar.log()


@pytest.mark.parametrize("reply_cache", [True, False], ids=["reply-cache", "forwarded"])
def test_bad_masks_are_invalid_argument_naming_the_path_or_the_session(tmp_path: Path, reply_cache: bool) -> None:
    sidecar = start_sidecar(tmp_path / "data", *([] if reply_cache else ["--reply-cache-bytes", "0"]))
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            client.merge("typed", message=pb.Checkpoint(goal="g"))
            client.put("opaque", b"\x08\x01")
            for session in ("typed", "opaque"):
                client.get(session)  # the whole replies kept, where the reply cache is on
            client.get("typed", field_mask=["handoff", "plan"])  # and a masked one
            for session, paths, refusal in [
                ("typed", ["handoff.summary"], r"field_mask path 'handoff\.summary': ckpt\.v1\.Handoff has no field"),
                ("typed", ["plan", "nope"], r"field_mask path 'nope': ckpt\.v1\.Checkpoint has no field 'nope'"),
                ("typed", ["plan.s1"], r"'plan\.s1': ckpt\.v1\.Checkpoint\.plan is not a singular message field"),
                ("typed", ["handoff..next"], r"field_mask path 'handoff\.\.next' is malformed"),
                ("typed", ["handoff\0plan"], r"field_mask path 'handoff\\x00plan' is malformed"),
                ("opaque", ["plan"], r"session 'opaque' version 1 has no message type \(opaque bytes\)"),
                ("missing", ["plan."], r"field_mask path 'plan\.' is malformed"),  # before the session is read
            ]:
                with pytest.raises(InvalidArgumentError, match=refusal):
                    client.get(session, field_mask=paths)
            with pytest.raises(NotFoundError, match="session 'missing' does not exist"):
                client.get("missing", field_mask=["plan"])
            assert client.get("opaque").state == b"\x08\x01"  # nothing changed by the refusals
    finally:
        assert sidecar.stop() == 0, sidecar.log()


def test_a_mask_follows_the_registered_type_as_it_changes(tmp_path: Path) -> None:
    # The gRPC process reads the registry the store process writes: a type registered after it started
    # is masked there, and a field renamed by a compatible re-registration is masked by its new name at
    # once, its old name refused (answered from a reply cache it keeps, as the metrics show).
    metrics_port = free_port()
    sidecar = start_sidecar(tmp_path / "data", "--metrics-port", str(metrics_port))
    sidecar.metrics_port = metrics_port  # type: ignore[attr-defined]
    state_class = agent_state_class(agent_file(summary=True))
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            client.register_type(descriptor_set_of(agent_file(summary=True)))
            for step in range(1, 4):
                client.merge("typed", agent_step(state_class, step).SerializeToString(), message_type=AGENT_STATE)
            client.merge("typed", state_class(summary="so far").SerializeToString())
            client.get("typed")  # its reply kept in the gRPC process
            hits = metric(sidecar, "ckpt_reply_cache_hits_total")
            for _ in range(2):  # made from the whole reply, then kept as it is
                got = client.get("typed", field_mask=["summary", "last"])
                assert (got.message_type, state_class.FromString(got.state)) == (
                    AGENT_STATE,
                    state_class(summary="so far"),
                )
            renamed = agent_file(summary=True)
            renamed.message_type[1].field[-1].name = "notes"
            client.register_type(descriptor_set_of(renamed))
            with pytest.raises(InvalidArgumentError, match=r"acme\.agent\.v1\.State has no field 'summary'"):
                client.get("typed", field_mask=["summary", "last"])  # not the masked reply kept before
            got = client.get("typed", field_mask=["notes", "entities"])
            notes_class = agent_state_class(renamed)
            expected = notes_class(notes="so far")
            expected.entities["e1"].CopyFrom(agent_step(notes_class, 3).entities["e1"])
            assert notes_class.FromString(got.state) == expected
            _wait_for_metric(sidecar, "ckpt_reply_cache_hits_total", hits + 3)
    finally:
        assert sidecar.stop() == 0, sidecar.log()


def _wait_for_metric(sidecar: Any, name: str, at_least: float) -> None:
    """A call this process answered reaches the store process's metrics a moment after its reply
    (storelink.SERVED_REPORT_SECONDS): wait for them."""
    deadline = time.monotonic() + 5
    while metric(sidecar, name, missing=0.0) < at_least:
        assert time.monotonic() < deadline, f"{name} stayed below {at_least}"
        time.sleep(0.02)


def test_a_raw_stub_gets_the_masked_state_and_its_message_type(tmp_path: Path) -> None:
    sidecar = start_sidecar(tmp_path / "data")
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            client.merge("agent", message=pb.Checkpoint(goal="g", handoff=pb.Handoff(next="n")))
        with grpc.insecure_channel(sidecar.tcp_target) as channel:
            stub = service_pb2_grpc.CheckpointServiceStub(channel)
            request = service_pb2.GetRequest(session_id="agent", field_mask=field_mask_pb2.FieldMask(paths=["handoff"]))
            reply = stub.Get(request, timeout=30)
            assert (reply.version, reply.message_type) == (1, CHECKPOINT)
            assert pb.Checkpoint.FromString(reply.state) == pb.Checkpoint(handoff=pb.Handoff(next="n"))
    finally:
        assert sidecar.stop() == 0, sidecar.log()


def test_the_async_client_masks_and_both_clients_refuse_a_str_mask(tmp_path: Path) -> None:
    sidecar = start_sidecar(tmp_path / "data")

    async def read() -> pb.Checkpoint:
        async with AsyncCheckpointClient(sidecar.unix_target) as client:
            with pytest.raises(
                TypeError, match=r"field_mask must be a sequence of paths, not a str: write \('plan',\)"
            ):
                await client.get("agent", field_mask="plan")
            got = await client.get("agent", field_mask=["plan", "handoff.next"])
            return pb.Checkpoint.FromString(got.state)

    try:
        with CheckpointClient(sidecar.unix_target) as client:
            client.merge("agent", message=pb.Checkpoint(goal="g", handoff=pb.Handoff(next="n", decided="d")))
            with pytest.raises(TypeError, match="not a str"):
                client.get("agent", field_mask="handoff")
        assert asyncio.run(read()) == pb.Checkpoint(handoff=pb.Handoff(next="n"))
    finally:
        assert sidecar.stop() == 0, sidecar.log()


@pytest.mark.parametrize("reply_cache", [True, False], ids=["reply-cache", "forwarded"])
def test_a_mask_path_deeper_than_protobuf_parses_is_invalid_argument_naming_the_limit(
    tmp_path: Path, reply_cache: bool
) -> None:
    node = descriptor_pb2.FileDescriptorProto(name="acme/node.proto", package="acme", syntax="proto3")
    message = node.message_type.add(name="Node")  # acme.Node {Node child = 1; int64 v = 2;}
    message.field.add(name="child", number=1, type=F.TYPE_MESSAGE, type_name=".acme.Node", label=F.LABEL_OPTIONAL)
    message.field.add(name="v", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    state = b"\x10\x07"  # v = 7, under 100 children: nested as deep as protobuf parses
    for _ in range(100):
        state = b"\x0a" + _varint(len(state)) + state
    sidecar = start_sidecar(tmp_path / "data", *([] if reply_cache else ["--reply-cache-bytes", "0"]))
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            client.register_type(descriptor_set_of(node))
            client.put("tree", state, message_type="acme.Node")
            assert client.get("tree").state == state
            deepest = ".".join(["child"] * 100 + ["v"])
            assert client.get("tree", field_mask=[deepest]).state == state
            for depth in (101, 2000):
                path = ".".join(["child"] * depth + ["v"])
                with pytest.raises(
                    InvalidArgumentError,
                    match=rf"field_mask path 'child\.child[a-z.]+'\.\.\. \({len(path)} characters\) goes {depth}"
                    r" messages deep; the limit is 100",
                ):
                    client.get("tree", field_mask=[path])
            assert client.get("tree", field_mask=["v"]).state == b""  # the sidecar still answers
    finally:
        assert sidecar.stop() == 0, sidecar.log()


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes([*out, n])
