"""The Python clients' typed writes against a real sidecar: register_type from a message class, put and
merge of messages, and a state read back as its message."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import EncodeError

from ckpt.sidecar.client import (
    AsyncCheckpointClient,
    CheckpointClient,
    ConflictError,
    FailedPreconditionError,
    parse_state,
)
from ckpt.v1 import checkpoint_pb2 as pb
from tests.support import AGENT_STATE, agent_state_class, agent_step, start_sidecar


def other_class() -> type:
    """acme.other.v1.Other, a type the sidecar never registers."""
    f = descriptor_pb2.FileDescriptorProto(name="acme/other.proto", package="acme.other.v1", syntax="proto3")
    f.message_type.add(name="Other").field.add(
        name="n", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_INT32, label=1
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("acme.other.v1.Other"))


def test_typed_writes_round_trip_through_both_clients(tmp_path: Path) -> None:
    state_class = agent_state_class()
    sidecar = start_sidecar(tmp_path / "data")
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            assert client.register_type(state_class) == [
                "acme.agent.v1.Entity",
                "acme.agent.v1.Entity.Note",
                AGENT_STATE,
            ]
            assert "ckpt.v1.Checkpoint" in client.register_type(pb.Checkpoint)  # built in: accepted as it is
            first = state_class(log=["start"], step=0)
            # Written as protobuf never would (a field twice): a REPLACE still reads back byte for byte.
            unusual = first.SerializeToString() + state_class(step=0).SerializeToString()
            client.put("agent", unusual, message_type=AGENT_STATE)
            assert client.get("agent").state == unusual
            expected = state_class.FromString(unusual)
            for step in range(1, 31):
                patch = agent_step(state_class, step)
                expected.MergeFrom(patch)
                client.merge("agent", message=patch)
            got = client.get("agent")
            assert got.message_type == AGENT_STATE
            assert parse_state(got, state_class) == expected  # equal as a message; the bytes are compacted
            assert client.sessions().__next__().message_type == AGENT_STATE
            with pytest.raises(ValueError, match=r"version 31 holds acme\.agent\.v1\.State, not ckpt\.v1\.Checkpoint"):
                parse_state(got, pb.Checkpoint)
            with pytest.raises(TypeError, match="give state or message, not both"):
                client.put("agent", b"", message=first)
            with pytest.raises(TypeError, match=r"patch must be bytes, not NoneType: give patch \(bytes\) or message"):
                client.merge("agent")
            with pytest.raises(TypeError, match="message names its own type"):
                client.merge("agent", message=first, message_type=AGENT_STATE)
            with pytest.raises(FailedPreconditionError, match=r"'acme\.other\.v1\.Other' is not registered") as refused:
                client.merge("other", message=other_class()(n=1))
            assert not isinstance(refused.value, ConflictError) and refused.value.request_id
            with pytest.raises(FailedPreconditionError, match=r"session 'agent' holds acme\.agent\.v1\.State"):
                client.merge("agent", message=pb.Checkpoint(step=1))

        async def from_asyncio() -> None:
            async with AsyncCheckpointClient(sidecar.unix_target) as aclient:
                assert (await aclient.register_type(state_class.DESCRIPTOR))[-1] == AGENT_STATE
                await aclient.merge("async", message=agent_step(state_class, 1))
                await aclient.put("async-replace", message=first)
                got = await aclient.get("async")
                assert parse_state(got, state_class) == agent_step(state_class, 1)
                assert (await aclient.get("async-replace")).state == first.SerializeToString()

        asyncio.run(from_asyncio())
    finally:
        assert sidecar.stop() == 0, sidecar.log()


def required_class() -> type:
    """acme.req.v1.Task, proto2: a required ``id`` and an optional ``step``."""
    f = descriptor_pb2.FileDescriptorProto(name="acme/req.proto", package="acme.req.v1", syntax="proto2")
    task = f.message_type.add(name="Task")
    task.field.add(name="id", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING, label=2)
    task.field.add(name="step", number=2, type=descriptor_pb2.FieldDescriptorProto.TYPE_INT32, label=1)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("acme.req.v1.Task"))


def test_a_merge_of_a_message_may_leave_out_required_fields_and_a_put_may_not(tmp_path: Path) -> None:
    task = required_class()
    sidecar = start_sidecar(tmp_path / "data")
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            client.register_type(task)
            client.put("t", message=task(id="a", step=1))
            assert client.merge("t", message=task(step=2)).version == 2  # the state holds id already
            assert parse_state(client.get("t"), task) == task(id="a", step=2)
            with pytest.raises(EncodeError, match=r"acme\.req\.v1\.Task is missing required fields: id"):
                client.put("t", message=task(step=3))  # a whole state without id
            assert client.get("t").version == 2

        async def from_asyncio() -> None:
            async with AsyncCheckpointClient(sidecar.unix_target) as aclient:
                assert (await aclient.merge("t", message=task(step=4))).version == 3
                with pytest.raises(EncodeError, match="missing required fields: id"):
                    await aclient.put("t", message=task(step=5))

        asyncio.run(from_asyncio())
        with CheckpointClient(sidecar.unix_target) as client:
            assert parse_state(client.get("t"), task) == task(id="a", step=4)
    finally:
        assert sidecar.stop() == 0, sidecar.log()
