"""What a re-registration may give a field number: the kind it has ever been registered with, removed fields'
and extensions' numbers included, remembered across registrations, restarts and stores written before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2

from ckpt.sidecar import FailedPrecondition, Store, StoreConfig
from tests.support import (
    DETAIL_FIELD,
    NOTE_AS_MESSAGE,
    NOTE_FIELD,
    NOTE_REMOVED,
    NOTE_STATE,
    NOTE_V1,
    STEP_FIELD,
    descriptor_set_of,
    edit_meta_and_types,
    numbered_file,
)

F = descriptor_pb2.FieldDescriptorProto
HISTORY_KEY = b"types_field_history"


@pytest.fixture
def config(tmp_path: Path) -> StoreConfig:
    return StoreConfig(data_dir=tmp_path / "data", sweep_interval_seconds=3600)


def extension_file(extension: tuple[int, int, str] | None, *, field: int | None = None) -> bytes:
    """A proto2 acme/e.proto whose State extends at ``extension`` (number, type, type name), or has a field
    ``field`` (number, an int64) and no extension range."""
    f = descriptor_pb2.FileDescriptorProto(name="acme/e.proto", package="acme", syntax="proto2")
    f.message_type.add(name="Sub").field.add(name="n", number=1, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    state = f.message_type.add(name="State")
    state.field.add(name="step", number=1, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    if field is not None:
        state.field.add(name="count", number=field, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    else:
        state.extension_range.add(start=100, end=200)
    if extension is not None:
        number, type_, type_name = extension
        ext = f.extension.add(name="extra", number=number, type=type_, extendee=".acme.State", label=F.LABEL_OPTIONAL)
        if type_name:
            ext.type_name = type_name
    return descriptor_set_of(f)


def head(store: Store) -> Any:
    """Session "s"'s head state, parsed as acme.State as registered now."""
    cls = store.message_class("acme.State")
    assert cls is not None
    return cls.FromString(store.get("s").state)


def stored(store: Store) -> dict[bytes, bytes]:
    """The `types` table and the meta values a registration writes, as stored."""
    tables = store.tables
    assert tables.types is not None and tables.meta is not None
    with store.read() as txn:
        out = {bytes(k): bytes(v) for k, v in txn.scan(tables.types)}
        for key in (b"types_generation", HISTORY_KEY):
            out[b"meta:" + key] = bytes(txn.get(key, db=tables.meta) or b"")
    return out


def test_a_removed_field_number_given_another_type_later_is_refused_across_a_restart(config: StoreConfig) -> None:
    with Store(config) as store:
        store.register_types(descriptor_set_of(NOTE_V1))
        store.put("s", NOTE_STATE, message_type="acme.State")
        store.register_types(
            descriptor_set_of(NOTE_REMOVED)
        )  # removing a field is fine: its bytes stay as unknown ones
    with Store(config) as store:
        before = stored(store)
        with pytest.raises(
            FailedPrecondition,
            match=r"^message acme\.State: field 'detail' \(number 2, named 'note' before, removed since\) would change"
            r" from bytes to acme\.Sub; a field number keeps its type and cardinality",
        ):
            store.register_types(descriptor_set_of(NOTE_AS_MESSAGE))
        assert stored(store) == before  # nothing stored
        assert head(store).step == 1
        # The number back with its old kind, under another name, is fine; so is a new number for the message.
        store.register_types(descriptor_set_of(numbered_file(STEP_FIELD, ("blob", 2, F.TYPE_BYTES, ""))))
        store.register_types(
            descriptor_set_of(
                numbered_file(STEP_FIELD, ("blob", 2, F.TYPE_BYTES, ""), ("detail", 3, F.TYPE_MESSAGE, ".acme.Sub"))
            )
        )
        assert head(store).blob == b"\xff\xff"


def test_a_removed_field_number_made_repeated_later_is_refused(config: StoreConfig) -> None:
    with Store(config) as store:
        store.register_types(descriptor_set_of(numbered_file(STEP_FIELD, ("score", 3, F.TYPE_INT64, ""))))
        store.register_types(descriptor_set_of(NOTE_REMOVED))
        scores = numbered_file(STEP_FIELD)
        scores.message_type[1].field.add(name="scores", number=3, type=F.TYPE_INT64, label=F.LABEL_REPEATED)
        with pytest.raises(
            FailedPrecondition,
            match=r"field 'scores' \(number 3, named 'score' before, removed since\) would change from int64 to"
            r" repeated int64",
        ):
            store.register_types(descriptor_set_of(scores))


def test_an_extension_number_keeps_its_type_changed_removed_or_made_a_field(config: StoreConfig) -> None:
    with Store(config) as store:
        store.register_types(extension_file((100, F.TYPE_BYTES, "")))
        store.put("s", b"\x08\x01\xa2\x06\x02\xff\xff", message_type="acme.State")  # step 1, extra b"\xff\xff"
        before = stored(store)
        refusal = r"^message acme\.State: extension 'acme\.extra' \(number 100\) would change from bytes to acme\.Sub"
        with pytest.raises(FailedPrecondition, match=refusal):
            store.register_types(extension_file((100, F.TYPE_MESSAGE, ".acme.Sub")))
        assert stored(store) == before
        store.register_types(extension_file(None))  # the extension removed
        with pytest.raises(FailedPrecondition, match=r"extension 'acme\.extra' \(number 100, removed since\) would"):
            store.register_types(extension_file((100, F.TYPE_INT32, "")))
        with pytest.raises(
            FailedPrecondition,
            match=r"field 'count' \(number 100, named 'acme\.extra' before, removed since\) would change from bytes"
            r" to int64",
        ):
            store.register_types(extension_file(None, field=100))
        store.register_types(extension_file((101, F.TYPE_MESSAGE, ".acme.Sub")))  # another number is fine
        assert head(store).step == 1


def test_a_store_registered_before_the_history_was_kept_starts_from_its_registered_files(
    config: StoreConfig,
) -> None:
    with Store(config) as store:
        store.register_types(descriptor_set_of(NOTE_V1))
        store.put("s", NOTE_STATE, message_type="acme.State")
    edit_meta_and_types(config.data_dir, delete=HISTORY_KEY)  # as a ckpt that did not keep it wrote the store
    with Store(config) as store:
        store.register_types(descriptor_set_of(NOTE_REMOVED))
        assert stored(store)[b"meta:" + HISTORY_KEY]
        with pytest.raises(
            FailedPrecondition, match=r"field 'detail' \(number 2, named 'note' before, removed since\)"
        ):
            store.register_types(descriptor_set_of(NOTE_AS_MESSAGE))


def test_files_registered_over_the_history_by_a_ckpt_that_did_not_keep_it_stand(config: StoreConfig) -> None:
    more = ("more", 4, F.TYPE_BOOL, "")
    with Store(config) as store:
        store.register_types(descriptor_set_of(NOTE_V1))  # the history: number 2 holds bytes
    # An earlier ckpt took NOTE_AS_MESSAGE (number 2 a message) and left the history as it was.
    edit_meta_and_types(config.data_dir, put_types={b"acme/r.proto": NOTE_AS_MESSAGE.SerializeToString()})
    with Store(config) as store:
        # The files in force say what number 2 holds now, and the history learns it from them.
        store.register_types(descriptor_set_of(numbered_file(STEP_FIELD, DETAIL_FIELD, more)))
        store.register_types(descriptor_set_of(numbered_file(STEP_FIELD, more)))
        with pytest.raises(
            FailedPrecondition,
            match=r"field 'note' \(number 2, named 'detail' before, removed since\) would change from acme\.Sub to"
            r" bytes",
        ):
            store.register_types(descriptor_set_of(numbered_file(STEP_FIELD, NOTE_FIELD, more)))
