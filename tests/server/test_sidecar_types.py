"""RegisterType and typed puts through a real `ckpt serve`: what a typed session is checked against and
compacted by, kept across a restart, and the status each bad registration or put gets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2

from ckpt.v1 import service_pb2, service_pb2_grpc
from tests.support import (
    AGENT_STATE,
    NOTE_AS_MESSAGE,
    NOTE_REMOVED,
    NOTE_STATE,
    NOTE_V1,
    agent_file,
    agent_state_class,
    agent_step,
    descriptor_set_of,
    edit_meta_and_types,
    start_sidecar,
)

MERGE = service_pb2.WRITE_MODE_MERGE
F = descriptor_pb2.FieldDescriptorProto
INVALID = grpc.StatusCode.INVALID_ARGUMENT
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION


def put(
    stub: service_pb2_grpc.CheckpointServiceStub,
    session: str,
    state: bytes,
    *,
    merge: bool = False,
    message_type: str = "",
) -> service_pb2.PutResponse:
    mode = MERGE if merge else service_pb2.WRITE_MODE_REPLACE
    request = service_pb2.PutRequest(session_id=session, state=state, mode=mode, message_type=message_type)
    response: service_pb2.PutResponse = stub.Put(request, timeout=30)
    return response


def refused(call: object, code: grpc.StatusCode) -> str:
    """What a call that must fail with ``code`` says."""
    assert isinstance(call, grpc.RpcError) and call.code() is code, call
    return str(call.details())


def failing(fn: object, *args: object, **kwargs: object) -> grpc.RpcError:
    try:
        fn(*args, **kwargs)  # type: ignore[operator]
    except grpc.RpcError as exc:
        return exc
    raise AssertionError("the call succeeded")


@pytest.fixture
def stub(tmp_path: Path) -> Iterator[service_pb2_grpc.CheckpointServiceStub]:
    sidecar = start_sidecar(tmp_path / "data")
    try:
        with grpc.insecure_channel(sidecar.unix_target) as channel:
            yield service_pb2_grpc.CheckpointServiceStub(channel)
    finally:
        assert sidecar.stop() == 0, sidecar.log()


def test_typed_sessions_are_validated_compacted_and_kept_across_a_restart(tmp_path: Path) -> None:
    state_class = agent_state_class()
    expected = state_class()
    sidecar = start_sidecar(tmp_path / "data")
    try:
        with grpc.insecure_channel(sidecar.unix_target) as channel:
            stub = service_pb2_grpc.CheckpointServiceStub(channel)
            registered = stub.RegisterType(
                service_pb2.RegisterTypeRequest(file_descriptor_set=descriptor_set_of(agent_file())), timeout=30
            )
            assert list(registered.message_types) == ["acme.agent.v1.Entity", "acme.agent.v1.Entity.Note", AGENT_STATE]
            for step in range(1, 61):
                patch = agent_step(state_class, step)
                expected.MergeFrom(patch)
                put(stub, "typed", patch.SerializeToString(), merge=True, message_type=AGENT_STATE)
                put(stub, "untyped", patch.SerializeToString(), merge=True)
            typed = stub.Get(service_pb2.GetRequest(session_id="typed"), timeout=30)
            untyped = stub.Get(service_pb2.GetRequest(session_id="untyped"), timeout=30)
            assert state_class.FromString(typed.state) == expected == state_class.FromString(untyped.state)
            assert (typed.message_type, untyped.message_type) == (AGENT_STATE, "")
            # The entity rewritten at every step: kept once per chain start, not once per patch.
            assert typed.info.state_size * 4 < untyped.info.state_size, (typed.info.state_size, untyped.info.state_size)
            listed = stub.ListSessions(service_pb2.ListSessionsRequest(), timeout=30).sessions
            assert {s.session_id: s.message_type for s in listed} == {"typed": AGENT_STATE, "untyped": ""}
            fork = stub.Fork(service_pb2.ForkRequest(session_id="typed", new_session_id="fork"), timeout=30)
            assert fork.session.message_type == AGENT_STATE
    finally:
        assert sidecar.stop() == 0, sidecar.log()
    sidecar = start_sidecar(tmp_path / "data")
    try:
        with grpc.insecure_channel(sidecar.unix_target) as channel:
            stub = service_pb2_grpc.CheckpointServiceStub(channel)
            for session in ("typed", "fork"):  # the registry and each session's type outlived the restart
                details = refused(failing(put, stub, session, b"\x0a\x03\x0a\x01\xff", merge=True), INVALID)
                assert "does not parse as acme.agent.v1.State: field 1 (entities) at offset 0" in details, details
            assert put(stub, "fork", agent_step(state_class, 61).SerializeToString(), merge=True).version == 2
            # A stream's typed write is checked alike, and fails alone.
            writes = [
                service_pb2.PutRequest(session_id="typed", state=b"\x12\x01\xff", mode=MERGE),
                service_pb2.PutRequest(session_id="typed", state=agent_step(state_class, 61).SerializeToString()),
            ]
            (answer,) = stub.PutStream(iter([service_pb2.PutStreamRequest(puts=writes, batch_id=1)]), timeout=30)
            bad, good = answer.results
            assert bad.error.code == INVALID.value[0] and "field 2 (log) at offset 0" in bad.error.message
            assert good.response.version == 61
    finally:
        assert sidecar.stop() == 0, sidecar.log()


def test_bad_registrations_and_puts_get_precise_statuses_and_change_nothing(
    stub: service_pb2_grpc.CheckpointServiceStub,
) -> None:
    state_class = agent_state_class()

    def register(data: bytes) -> service_pb2.RegisterTypeResponse:
        response: service_pb2.RegisterTypeResponse = stub.RegisterType(
            service_pb2.RegisterTypeRequest(file_descriptor_set=data), timeout=30
        )
        return response

    # A type nobody registered: refused, and nothing written.
    details = refused(failing(put, stub, "s", b"\x18\x01", merge=True, message_type=AGENT_STATE), PRECONDITION)
    assert details.startswith("message_type 'acme.agent.v1.State' is not registered: call RegisterType"), details
    assert refused(failing(stub.Get, service_pb2.GetRequest(session_id="s"), timeout=30), grpc.StatusCode.NOT_FOUND)
    register(descriptor_set_of(agent_file()))
    put(stub, "s", agent_step(state_class, 1).SerializeToString(), merge=True, message_type=AGENT_STATE)
    needs = descriptor_pb2.FileDescriptorProto(name="a.proto", dependency=["b.proto"])
    for data, words in [
        (b"\xff\xff", "file_descriptor_set (2 bytes) does not parse as a google.protobuf.FileDescriptorSet"),
        (b"", "file_descriptor_set holds no files"),
        (descriptor_set_of(needs), "file 'a.proto' imports 'b.proto', which is neither in the set nor registered"),
    ]:
        assert words in refused(failing(register, data), INVALID)
    details = refused(failing(register, descriptor_set_of(agent_file(log_type=F.TYPE_BYTES))), PRECONDITION)
    assert (
        "message acme.agent.v1.State: field 'log' (number 2) would change from repeated string to repeated bytes"
        in details
    ), details
    # The first registration is still in force: log holds strings.
    assert "field 2 (log) at offset 0" in refused(failing(put, stub, "s", b"\x12\x01\xff", merge=True), INVALID)
    put(stub, "s", agent_step(state_class, 2).SerializeToString(), merge=True)
    # A compatible change is taken, and its new field checked from then on.
    register(descriptor_set_of(agent_file(summary=True)))
    assert "field 5 (summary) at offset 0" in refused(failing(put, stub, "s", b"\x2a\x01\xff", merge=True), INVALID)
    put(stub, "s", b"\x2a\x02ok", merge=True, message_type=AGENT_STATE)
    # Another type than the session's.
    details = refused(failing(put, stub, "s", b"", merge=True, message_type="ckpt.v1.Checkpoint"), PRECONDITION)
    assert details == (
        "session 's' holds acme.agent.v1.State states; this put's message_type is ckpt.v1.Checkpoint (a session"
        " keeps the type it was first written with, and its forks keep it: write another session)"
    )
    # A typed REPLACE that does not parse.
    details = refused(failing(put, stub, "s", b"\x12\x05ab"), INVALID)
    assert (
        details == "state (4 bytes) does not parse as acme.agent.v1.State: field 2 at offset 0 declares 5 bytes, 2 left"
    )
    # Cut inside a tag: a REPLACE's state is not called a patch.
    details = refused(failing(put, stub, "s", b"\x80"), INVALID)
    assert details == (
        "state (1 bytes) does not parse as acme.agent.v1.State:"
        " truncated tag varint at offset 0, the end of the 1 bytes"
    )
    got = stub.Get(service_pb2.GetRequest(session_id="s"), timeout=30)
    assert got.version == 3 and state_class.FromString(got.state).step == 2


def test_a_removed_field_number_keeps_its_type_across_a_restart_and_a_masked_get_names_a_state_that_no_longer_parses(
    tmp_path: Path,
) -> None:
    def register(stub: service_pb2_grpc.CheckpointServiceStub, f: descriptor_pb2.FileDescriptorProto) -> None:
        stub.RegisterType(service_pb2.RegisterTypeRequest(file_descriptor_set=descriptor_set_of(f)), timeout=30)

    def masked(stub: service_pb2_grpc.CheckpointServiceStub, *paths: str) -> service_pb2.GetResponse:
        request = service_pb2.GetRequest(session_id="s", field_mask={"paths": paths})
        response: service_pb2.GetResponse = stub.Get(request, timeout=30)
        return response

    data = tmp_path / "data"
    sidecar = start_sidecar(data)
    try:
        with grpc.insecure_channel(sidecar.unix_target) as channel:
            stub = service_pb2_grpc.CheckpointServiceStub(channel)
            register(stub, NOTE_V1)
            put(stub, "s", NOTE_STATE, message_type="acme.State")
            register(stub, NOTE_REMOVED)  # note (number 2, bytes) removed
    finally:
        assert sidecar.stop() == 0, sidecar.log()
    sidecar = start_sidecar(data)
    try:
        with grpc.insecure_channel(sidecar.unix_target) as channel:
            stub = service_pb2_grpc.CheckpointServiceStub(channel)
            details = refused(failing(register, stub, NOTE_AS_MESSAGE), PRECONDITION)
            assert details.startswith(
                "message acme.State: field 'detail' (number 2, named 'note' before, removed since) would change from"
                " bytes to acme.Sub"
            ), details
            assert masked(stub, "step").state == b"\x08\x01"
    finally:
        assert sidecar.stop() == 0, sidecar.log()
    # A store where an earlier ckpt took NOTE_AS_MESSAGE all the same: a path into the field is DATA_LOSS naming it.
    edit_meta_and_types(data, put_types={b"acme/r.proto": NOTE_AS_MESSAGE.SerializeToString()})
    sidecar = start_sidecar(data)
    try:
        with grpc.insecure_channel(sidecar.unix_target) as channel:
            stub = service_pb2_grpc.CheckpointServiceStub(channel)
            details = refused(failing(masked, stub, "detail.n"), grpc.StatusCode.DATA_LOSS)
            assert details == (
                "session 's' version 1: its state does not parse as its type: acme.State's field 2 (detail) does not"
                " parse as declared (4 bytes): Wire format was corrupt"
            ), details
            assert masked(stub, "step").state == b"\x08\x01"
    finally:
        assert sidecar.stop() == 0, sidecar.log()


def note_file(syntax: str, *, utf8: int = 0, with_text: bool = True) -> descriptor_pb2.FileDescriptorProto:
    """acme/u8.proto's acme.u8.Note (text = 1: a string; tags = 2: a map<string, string>) in ``syntax``
    ("editions": edition 2023, its file-wide ``utf8_validation`` ``utf8`` if given); without text if not
    ``with_text``."""
    f = descriptor_pb2.FileDescriptorProto(name="acme/u8.proto", package="acme.u8", syntax=syntax)
    if syntax == "editions":
        f.edition = descriptor_pb2.EDITION_2023
        if utf8:
            f.options.features.utf8_validation = utf8  # type: ignore[assignment]
    note = f.message_type.add(name="Note")
    if with_text:
        note.field.add(name="text", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    note.field.add(
        name="tags", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED, type_name=".acme.u8.Note.TagsEntry"
    )
    entry = note.nested_type.add(name="TagsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    return f


def test_a_string_field_may_stop_being_utf8_validated_but_never_start_again(
    stub: service_pb2_grpc.CheckpointServiceStub,
) -> None:
    def register(f: descriptor_pb2.FileDescriptorProto) -> None:
        stub.RegisterType(service_pb2.RegisterTypeRequest(file_descriptor_set=descriptor_set_of(f)), timeout=30)

    unchecked = "a string not UTF-8 validated stays so for good (stored states may hold other bytes"
    not_utf8 = b"\x0a\x02\xff\xfe"  # text: bytes a proto2 string holds and a proto3 one refuses
    register(note_file("proto3"))
    assert "field 1 (text) at offset 0" in refused(
        failing(put, stub, "n", not_utf8, message_type="acme.u8.Note"), INVALID
    )
    put(stub, "n", b"\x0a\x02ok", message_type="acme.u8.Note")
    # Validated -> not: what is stored is UTF-8, so every state still parses.
    register(note_file("editions", utf8=descriptor_pb2.FeatureSet.NONE))
    register(note_file("proto2"))  # the same kinds: nothing changes
    put(stub, "n", not_utf8, merge=True)
    for again in (note_file("proto3"), note_file("editions")):  # editions 2023 validates by default
        details = refused(failing(register, again), PRECONDITION)
        assert details.startswith(
            "message acme.u8.Note: field 'text' (number 1) would change from string (no UTF-8 check) to string; "
            + unchecked
        ), details
    # Removed, then re-added validated: stored states still hold its bytes.
    register(note_file("proto2", with_text=False))
    details = refused(failing(register, note_file("proto3")), PRECONDITION)
    assert "field 'text' (number 1, removed since) would change from string (no UTF-8 check) to string" in details
    # A map's strings alike; the type in force parses every stored state still.
    register(note_file("proto2"))
    details = refused(failing(register, note_file("editions", utf8=descriptor_pb2.FeatureSet.VERIFY)), PRECONDITION)
    assert "would change from string (no UTF-8 check) to string" in details, details
    got = stub.Get(service_pb2.GetRequest(session_id="n", field_mask={"paths": ["text", "tags"]}), timeout=30)
    assert got.state.endswith(b"\x0a\x02\xff\xfe"), got.state
    put(stub, "n", got.state)  # a typed REPLACE of what is stored parses


def test_a_set_naming_a_file_in_bytes_that_are_not_utf8_is_invalid_argument(
    stub: service_pb2_grpc.CheckpointServiceStub,
) -> None:
    def register(data: bytes) -> None:
        stub.RegisterType(service_pb2.RegisterTypeRequest(file_descriptor_set=data), timeout=30)

    named = descriptor_set_of(note_file("proto3")).replace(b"acme/u8", b"acme/\xff8")  # as long: lengths stay right
    details = refused(failing(register, named), INVALID)
    assert details == "file_descriptor_set's file 0 has a name that is not UTF-8: b'acme/\\xff8.proto'", details
    importing = note_file("proto3")
    importing.dependency.append("acme/dep.proto")
    details = refused(failing(register, descriptor_set_of(importing).replace(b"acme/dep", b"acme/\xfeep")), INVALID)
    assert details == "file 'acme/u8.proto' imports a file whose name is not UTF-8: b'acme/\\xfeep.proto'", details
    register(descriptor_set_of(note_file("proto3")))  # the sidecar serves on
