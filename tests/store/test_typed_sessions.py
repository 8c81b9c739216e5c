"""Typed sessions in the embedded store: registered message types, what a typed write is checked against,
compaction by the session's own type, and what a registration may change."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, timestamp_pb2

from ckpt.codec import ChainPolicy
from ckpt.sidecar import FailedPrecondition, InvalidArgument, Store, StoreConfig, WriteMode
from ckpt.sidecar.descriptors import MAX_DESCRIPTOR_SET_BYTES, descriptor_set
from ckpt.v1 import checkpoint_pb2 as pb
from tests.support import (
    AGENT_STATE,
    EVOLVING_STATE,
    agent_file,
    agent_state_class,
    agent_step,
    descriptor_set_of,
    evolving_file,
    evolving_state_class,
)

MERGE = WriteMode.MERGE
F = descriptor_pb2.FieldDescriptorProto


@pytest.fixture
def config(tmp_path: Path) -> StoreConfig:
    return StoreConfig(data_dir=tmp_path / "data", chain_policy=ChainPolicy(max_depth=8), sweep_interval_seconds=3600)


def registered_files(store: Store) -> dict[str, bytes]:
    """The `types` table as stored, and the generation (under "")."""
    tables = store.tables
    assert tables.types is not None and tables.meta is not None
    with store.read() as txn:
        out = {bytes(k).decode(): bytes(v) for k, v in txn.scan(tables.types)}
        out[""] = bytes(txn.get(b"types_generation", db=tables.meta) or b"")
    return out


def test_a_typed_session_compacts_its_merges_where_an_untyped_one_keeps_every_patch(config: StoreConfig) -> None:
    state_class = agent_state_class()
    with Store(config) as store:
        assert store.register_types(descriptor_set_of(agent_file())) == [
            "acme.agent.v1.Entity",
            "acme.agent.v1.Entity.Note",
            AGENT_STATE,
        ]
        expected = state_class()
        for step in range(1, 61):
            patch = agent_step(state_class, step)
            expected.MergeFrom(patch)
            store.put("typed", patch.SerializeToString(), mode=MERGE, message_type=AGENT_STATE)
            store.put("untyped", patch.SerializeToString(), mode=MERGE)
        typed, untyped = store.get("typed"), store.get("untyped")
        assert state_class.FromString(typed.state) == expected == state_class.FromString(untyped.state)
        assert typed.state != untyped.state  # equal as messages, not as bytes
        # The entity rewritten in place is kept once per chain start, not once per patch.
        patch_bytes = agent_step(state_class, 60).ByteSize()
        assert len(untyped.state) > 55 * patch_bytes
        assert len(typed.state) < 12 * patch_bytes, (len(typed.state), patch_bytes)
        assert (typed.info.message_type, untyped.info.message_type) == (AGENT_STATE, "")
        assert (store.session("typed").message_type, store.session("untyped").message_type) == (AGENT_STATE, "")
    with Store(config) as store:  # the registry outlives the store: typed writes are still checked
        assert store.session("typed").message_type == AGENT_STATE
        with pytest.raises(InvalidArgument, match=r"does not parse as acme\.agent\.v1\.State: field 1 \(entities\)"):
            store.put("typed", b"\x0a\x03\x0a\x01\xff", mode=MERGE)  # a map key of invalid UTF-8
        assert store.get("typed").version == 60
        assert state_class.FromString(store.get("typed", 17).state).step == 17  # cold, an older version


def test_a_typed_replace_must_parse_and_reads_back_byte_for_byte(config: StoreConfig) -> None:
    state_class = agent_state_class()
    # Two values of one singular field: valid, but not how protobuf would write it.
    unusual = state_class(step=1).SerializeToString() + state_class(step=2, log=["a"]).SerializeToString()
    with Store(config) as store:
        store.register_types(descriptor_set_of(agent_file()))
        store.put("s", unusual, message_type=AGENT_STATE)
        assert store.get("s").state == unusual
        with pytest.raises(
            InvalidArgument, match=r"state \(4 bytes\) does not parse as acme\.agent\.v1\.State: field 2"
        ):
            store.put("s", b"\x12\x02\xc3\x28", message_type=AGENT_STATE)  # log: invalid UTF-8
        with pytest.raises(InvalidArgument, match=r"does not parse as acme\.agent\.v1\.State: .*offset 2"):
            store.put("s", b"\x18\x01\x12\x05ab")  # the session's type, named or not; truncated at offset 2
        assert store.get("s").version == 1
        store.put("s", state_class(step=3).SerializeToString())  # a REPLACE of the session's type, unnamed
        assert store.get("s").info.message_type == AGENT_STATE
        # The type is part of what a request id's retry must ask again.
        again = state_class(step=4).SerializeToString()
        assert store.put("s", again, message_type=AGENT_STATE, request_id="r").version == 3
        assert store.put("s", again, message_type=AGENT_STATE, request_id="r").replayed
        with pytest.raises(InvalidArgument, match="request_id 'r' was used for a different write"):
            store.put("s", again, request_id="r")


def test_a_put_naming_an_unregistered_type_is_refused_and_writes_nothing(config: StoreConfig) -> None:
    with Store(config) as store:
        for mode in (WriteMode.REPLACE, MERGE):
            with pytest.raises(
                FailedPrecondition,
                match=r"message_type 'acme\.agent\.v1\.State' is not registered: call RegisterType",
            ):
                store.put("s", b"\x18\x01", mode=mode, message_type=AGENT_STATE)
        with pytest.raises(InvalidArgument, match=r"message_type 'not a name' is not a message type's full name"):
            store.put("s", b"", message_type="not a name")
        assert store.list_sessions() == ([], "")


def test_a_session_keeps_its_type_and_an_untyped_one_takes_the_first_it_is_given(config: StoreConfig) -> None:
    state_class = agent_state_class()
    with Store(config) as store:
        store.register_types(descriptor_set_of(agent_file()))
        store.put("s", state_class(step=7).SerializeToString())  # untyped: any bytes would go
        store.put("s", state_class(step=1).SerializeToString(), mode=MERGE, message_type=AGENT_STATE)
        assert store.session("s").message_type == AGENT_STATE
        assert [store.get("s", v).info.message_type for v in (1, 2)] == ["", AGENT_STATE]
        with pytest.raises(
            FailedPrecondition,
            match=r"session 's' holds acme\.agent\.v1\.State states; this put's message_type is ckpt\.v1\.Checkpoint",
        ):
            store.put("s", pb.Checkpoint(step=2).SerializeToString(), mode=MERGE, message_type="ckpt.v1.Checkpoint")
        # Bytes that do not parse as the type named (field 6 of a Checkpoint is a message): the type named is
        # still what is wrong (this was InvalidArgument, "does not parse as ckpt.v1.Checkpoint").
        for mode in (MERGE, WriteMode.REPLACE):
            with pytest.raises(FailedPrecondition, match=r"holds acme\.agent\.v1\.State states; this put's"):
                store.put("s", b"\x32\x01\xff", mode=mode, message_type="ckpt.v1.Checkpoint")
        assert store.get("s").version == 2
        fork = store.fork("s", 0, "s-fork")
        assert fork.message_type == AGENT_STATE
        with pytest.raises(InvalidArgument, match=r"does not parse as acme\.agent\.v1\.State"):
            store.put("s-fork", b"\x0a\x03\x0a\x01\xff", mode=MERGE)
        # A built-in type needs no registration.
        store.put("c", pb.Checkpoint(goal="g").SerializeToString(), message_type="ckpt.v1.Checkpoint")
        assert store.session("c").message_type == "ckpt.v1.Checkpoint"


def test_bad_descriptor_sets_are_refused_by_name_and_store_nothing(config: StoreConfig) -> None:
    needs = descriptor_pb2.FileDescriptorProto(
        name="acme/uses.proto", package="acme", dependency=["acme/missing.proto"]
    )
    twin = descriptor_pb2.FileDescriptorProto(name="acme/twin.proto", package="acme.agent.v1")
    twin.message_type.add(name="State")  # defined by agent_file() already
    other_timestamp = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(other_timestamp)
    other_timestamp.message_type[0].field.add(name="zone", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    with Store(config) as store:
        store.register_types(descriptor_set_of(agent_file()))
        before = registered_files(store)
        for data, refusal in [
            (
                b"\xff\xff not a descriptor set",
                r"file_descriptor_set \(23 bytes\) does not parse as a google\.protobuf\.FileDescriptorSet: Wire",
            ),
            (b"", "file_descriptor_set holds no files"),
            (descriptor_set_of(needs), r"file 'acme/uses\.proto' imports 'acme/missing\.proto', which is neither in"),
            (descriptor_set_of(twin), r"protobuf refuses file 'acme/twin\.proto'"),
            (descriptor_set_of(other_timestamp), r"file 'google/protobuf/timestamp\.proto' is built into ckpt"),
            (bytes(MAX_DESCRIPTOR_SET_BYTES + 1), r"file_descriptor_set is 4194305 bytes; the limit is 4194304"),
            (descriptor_set_of(agent_file(), agent_file()), r"holds file 'acme/agent/v1/state\.proto' twice"),
            # descriptor.proto's strings are proto2's: bytes that are not UTF-8 parse, and are refused by name
            # (each replacement as long as what it replaces: the lengths before it stay right).
            (
                descriptor_set_of(agent_file()).replace(b"acme/agent", b"acme/\xffgent"),
                r"^file_descriptor_set's file 0 has a name that is not UTF-8: b'acme/\\xffgent/v1/state\.proto'$",
            ),
            (
                descriptor_set_of(needs).replace(b"acme/missing", b"acme/\xfeissing"),
                r"^file 'acme/uses\.proto' imports a file whose name is not UTF-8: b'acme/\\xfeissing\.proto'$",
            ),
        ]:
            with pytest.raises(InvalidArgument, match=refusal):
                store.register_types(data)
        assert registered_files(store) == before


def test_an_incompatible_registration_is_refused_and_the_earlier_type_stays_in_force(config: StoreConfig) -> None:
    state_class = agent_state_class()
    as_map = agent_file()
    as_map.message_type[1].field[0].type_name = ".acme.agent.v1.Entity"  # entities: a repeated Entity, not a map
    dropped = agent_file()
    del dropped.message_type[0].nested_type[0]  # Entity.Note, and the fields of that type (fields may go)
    del dropped.message_type[0].field[2]
    del dropped.message_type[1].field[3]
    with Store(config) as store:
        store.register_types(descriptor_set_of(agent_file()))
        store.put("s", agent_step(state_class, 1).SerializeToString(), mode=MERGE, message_type=AGENT_STATE)
        before = registered_files(store)
        for f, refusal in [
            (
                agent_file(log_type=F.TYPE_INT64),
                r"message acme\.agent\.v1\.State: field 'log' \(number 2\) would change from repeated string to"
                r" repeated int64",
            ),
            (
                as_map,
                r"field 'entities' \(number 1\) would change from map<string, acme\.agent\.v1\.Entity> to repeated"
                r" acme\.agent\.v1\.Entity",
            ),
            (dropped, r"message acme\.agent\.v1\.Entity\.Note .* is no longer defined"),
        ]:
            with pytest.raises(FailedPrecondition, match=refusal):
                store.register_types(descriptor_set_of(f))
        assert registered_files(store) == before
        store.put("s", agent_step(state_class, 2).SerializeToString(), mode=MERGE, message_type=AGENT_STATE)
        with pytest.raises(InvalidArgument, match="field 2 \\(log\\)"):
            store.put("s", b"\x12\x01\xff", mode=MERGE)  # log is still a string


def test_a_compatible_registration_is_used_from_then_on_by_every_session_and_cached_encoder(
    config: StoreConfig,
) -> None:
    v1, v2 = agent_state_class(), agent_state_class(agent_file(summary=True))
    with Store(config) as store:
        store.register_types(descriptor_set_of(agent_file()))
        for step in range(1, 4):  # the session's encoder is cached, compacting with version 1's class
            store.put("s", agent_step(v1, step).SerializeToString(), mode=MERGE, message_type=AGENT_STATE)
        generation = registered_files(store)[""]
        assert store.register_types(descriptor_set_of(agent_file(summary=True)))[-1] == AGENT_STATE
        assert registered_files(store)[""] == b"%d" % (int(generation) + 1)
        # Field 5 was an unknown field to version 1 (taken as it came); now it is a string, checked.
        with pytest.raises(InvalidArgument, match=r"field 5 \(summary\) at offset 0"):
            store.put("s", b"\x2a\x01\xff", mode=MERGE)
        expected = v2.FromString(store.get("s").state)
        for step in range(4, 64):  # the summary rewritten in place: compacted by version 2's class only
            patch = v2(summary=f"summary {step:04d} " + "s" * 300)
            expected.MergeFrom(patch)
            store.put("s", patch.SerializeToString(), mode=MERGE)
        state = store.get("s").state
        assert v2.FromString(state) == expected
        assert len(state) < 12 * patch.ByteSize(), len(state)
        # The same set again changes nothing.
        store.register_types(descriptor_set_of(agent_file(summary=True)))
        assert registered_files(store)[""] == b"%d" % (int(generation) + 1)


def test_versions_holding_what_the_type_did_not_know_read_as_their_writes_once_it_is_registered(
    config: StoreConfig,
) -> None:
    # A newer client writes a closed enum's value (BLUE = 99) and a oneof member (onew) that the registered
    # version 1 lacks, then writes of RED and ostr; version 2, adding both, is registered afterwards.
    v2 = evolving_state_class(2)
    writes = [v2(color=99, onew=5).SerializeToString()]
    writes += [v2(color=1, ostr="x", note=f"{i}" * 400).SerializeToString() for i in range(1, 9)]
    with Store(replace(config, chain_policy=ChainPolicy(max_depth=2))) as store:
        store.register_types(descriptor_set_of(evolving_file(1)))
        for write in writes:
            store.put("s", write, mode=MERGE, message_type=EVOLVING_STATE)
        store.register_types(descriptor_set_of(evolving_file(2)))
        later = [v2(color=1, note=f"{i}" * 400).SerializeToString() for i in range(9, 30)]
        for write in later:  # version 2 knows every field: its chain starts compact again
            store.put("s", write, mode=MERGE)
        want = v2()
        for version, write in enumerate(writes + later, 1):
            want.MergeFromString(write)
            got = v2.FromString(store.get("s", version).state)
            assert (got, got.WhichOneof("choice")) == (want, "ostr" if version > 1 else "onew"), version
        assert len(store.get("s").state) < len(b"".join(writes + later)) / 4


def test_the_built_in_files_may_be_sent_again_unchanged(config: StoreConfig) -> None:
    with Store(config) as store:
        names = store.register_types(descriptor_set(pb.Checkpoint))
        assert "ckpt.v1.Checkpoint" in names and "google.protobuf.Timestamp" in names
        assert registered_files(store) == {"": b""}  # built in: nothing stored


def test_merge_message_type_types_the_sessions_merged_without_one(config: StoreConfig) -> None:
    with pytest.raises(ValueError, match=r"merge_message_type 'acme\.agent\.v1\.State' is not a protobuf message type"):
        replace(config, merge_message_type=AGENT_STATE)  # the store's to know: named on each put instead
    with Store(replace(config, merge_message_type="ckpt.v1.Checkpoint")) as store:
        store.put("replaced", b"opaque")  # a REPLACE leaves a session untyped
        store.put("merged", pb.Checkpoint(step=1).SerializeToString(), mode=MERGE)
        assert (store.session("replaced").message_type, store.session("merged").message_type) == (
            "",
            "ckpt.v1.Checkpoint",
        )
    with (  # the session keeps the type without the option
        Store(config) as store,
        pytest.raises(InvalidArgument, match=r"does not parse as ckpt\.v1\.Checkpoint"),
    ):
        store.put("merged", b"\x82\x01\x01\x08", mode=MERGE)


def test_the_store_merge_type_leaves_untyped_a_session_whose_head_does_not_parse_as_it(config: StoreConfig) -> None:
    garbage = b"\xff\xfe opaque bytes"
    patches = [pb.Checkpoint(step=i).SerializeToString() for i in range(1, 12)]  # past a chain start (max_depth 8)
    with Store(replace(config, merge_message_type="ckpt.v1.Checkpoint")) as store:
        store.put("opaque", garbage)
        for patch in patches:
            store.put("opaque", patch, mode=MERGE)
        assert store.session("opaque").message_type == ""
        got = store.get("opaque")
        assert (got.state, got.info.message_type) == (garbage + b"".join(patches), "")
    with Store(replace(config, merge_message_type="ckpt.v1.Checkpoint")) as store:  # cold, from LMDB
        assert store.get("opaque").state == garbage + b"".join(patches)
        assert store.session("opaque").message_type == ""


def test_the_store_merge_type_types_a_session_whose_head_parses_as_it(config: StoreConfig) -> None:
    with Store(replace(config, merge_message_type="ckpt.v1.Checkpoint")) as store:
        store.put("checkpoint", pb.Checkpoint(goal="ship it", step=1).SerializeToString())
        assert store.session("checkpoint").message_type == ""  # a REPLACE naming no type
        store.put("checkpoint", pb.Checkpoint(step=2).SerializeToString(), mode=MERGE)
        assert store.session("checkpoint").message_type == "ckpt.v1.Checkpoint"
        assert store.get("checkpoint").info.message_type == "ckpt.v1.Checkpoint"
        assert pb.Checkpoint.FromString(store.get("checkpoint").state) == pb.Checkpoint(goal="ship it", step=2)
        store.put("fresh", pb.Checkpoint(step=1).SerializeToString(), mode=MERGE)
        assert store.session("fresh").message_type == "ckpt.v1.Checkpoint"
        with pytest.raises(InvalidArgument, match=r"does not parse as ckpt\.v1\.Checkpoint"):
            store.put("checkpoint", b"\x82\x01\x01\x08", mode=MERGE)  # typed now: its patches are checked


def test_a_typed_merge_onto_an_untyped_head_that_does_not_parse_as_its_type_is_refused(config: StoreConfig) -> None:
    garbage = b"\xff\xfe opaque bytes"
    with Store(config) as store:
        store.put("opaque", garbage)
        with pytest.raises(
            FailedPrecondition,
            match=r"session 'opaque' is untyped and its head \(version 1\) does not parse as ckpt\.v1\.Checkpoint",
        ):
            store.put(
                "opaque", pb.Checkpoint(step=1).SerializeToString(), mode=MERGE, message_type="ckpt.v1.Checkpoint"
            )
        assert (store.session("opaque").message_type, store.get("opaque").state) == ("", garbage)
        # A REPLACE under the type types it; MERGEs under it then land.
        store.put("opaque", pb.Checkpoint(goal="g").SerializeToString(), message_type="ckpt.v1.Checkpoint")
        store.put("opaque", pb.Checkpoint(step=2).SerializeToString(), mode=MERGE, message_type="ckpt.v1.Checkpoint")
        assert pb.Checkpoint.FromString(store.get("opaque").state) == pb.Checkpoint(goal="g", step=2)
        # An untyped head that parses takes the type as before.
        store.put("parses", pb.Checkpoint(goal="h").SerializeToString())
        store.put("parses", pb.Checkpoint(step=3).SerializeToString(), mode=MERGE, message_type="ckpt.v1.Checkpoint")
        assert store.session("parses").message_type == "ckpt.v1.Checkpoint"


def test_a_fork_of_a_version_from_before_the_session_was_typed_stays_untyped_unless_it_parses(
    config: StoreConfig,
) -> None:
    opaque = b"\xff\xff\xff"
    typed = pb.Checkpoint(goal="g").SerializeToString()
    with Store(config) as store:
        store.put("s", opaque)
        store.put("s", typed, message_type="ckpt.v1.Checkpoint")
        store.put("p", pb.Checkpoint(goal="early").SerializeToString())  # untyped, but parses as the type
        store.put("p", typed, message_type="ckpt.v1.Checkpoint")
        assert store.fork("s", 1, "s-early").message_type == ""
        got = store.get("s-early")
        assert (got.state, got.info.message_type) == (opaque, "")
        # Untyped, a MERGE lands as bytes; a typed MERGE onto it is refused as onto any untyped head.
        with pytest.raises(FailedPrecondition, match=r"session 's-early' is untyped"):
            store.put("s-early", typed, mode=MERGE, message_type="ckpt.v1.Checkpoint")
        assert store.fork("s", 2, "s-late").message_type == "ckpt.v1.Checkpoint"
        # An early version that parses as the type carries the session's type into its fork.
        assert store.fork("p", 1, "p-early").message_type == "ckpt.v1.Checkpoint"
        assert store.get("p-early").info.message_type == "ckpt.v1.Checkpoint"
