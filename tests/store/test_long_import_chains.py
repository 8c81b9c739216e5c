"""Import chains longer than Python's recursion limit, in the embedded store: registered in any order and
loaded again in the store's own (key) order, a circle refused by name, a type's set built from its class; and a
registry that does not load leaves the store open, naming why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from ckpt.sidecar import DataLoss, InvalidArgument, Store, StoreConfig, WriteMode, descriptors
from ckpt.sidecar.tools import crosscheck
from tests.support import descriptor_set_of

F = descriptor_pb2.FieldDescriptorProto
FILES = 5000


@pytest.fixture
def config(tmp_path: Path) -> StoreConfig:
    return StoreConfig(data_dir=tmp_path / "data", sweep_interval_seconds=3600)


def chain(n: int, *, circle: bool = False) -> list[descriptor_pb2.FileDescriptorProto]:
    """f00000.proto importing f00001.proto importing ... f{n-1}.proto (importing f00000.proto if ``circle``),
    each defining pN.M {int64 x = 1}."""
    files = []
    for i in range(n):
        f = descriptor_pb2.FileDescriptorProto(name=f"f{i:05d}.proto", package=f"p{i}", syntax="proto3")
        if i + 1 < n or circle:
            f.dependency.append(f"f{(i + 1) % n:05d}.proto")
        f.message_type.add(name="M").field.add(name="x", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
        files.append(f)
    return files


@pytest.mark.parametrize("head_first", [False, True], ids=["sent-last-first", "sent-first-first"])
def test_a_long_import_chain_registers_in_either_order_and_loads_when_the_store_opens_again(
    config: StoreConfig, head_first: bool
) -> None:
    files = chain(FILES)
    with Store(config) as store:
        types = store.register_types(descriptor_set_of(*(files if head_first else files[::-1])))
        assert len(types) == FILES
    with Store(config) as store:
        assert store.put("s", b"\x08\x07", message_type="p0.M").version == 1
        assert store.get("s").state == b"\x08\x07"
        assert store.message_class(f"p{FILES - 1}.M") is not None


def test_a_long_import_circle_is_refused_by_name_and_stores_nothing(config: StoreConfig) -> None:
    with Store(config) as store:
        with pytest.raises(InvalidArgument, match=r"file 'f00000\.proto' imports itself, through 'f04999\.proto'"):
            store.register_types(descriptor_set_of(*chain(FILES, circle=True)))
        assert store.message_class("p0.M") is None
    with Store(config) as store:
        assert store.message_class("p0.M") is None


def test_the_set_of_a_type_at_the_head_of_a_long_import_chain_holds_every_file_after_its_imports() -> None:
    files = chain(FILES)
    pool = descriptor_pool.DescriptorPool()
    for f in reversed(files):
        pool.Add(f)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("p0.M"))
    sent = descriptor_pb2.FileDescriptorSet.FromString(descriptors.descriptor_set(cls))
    assert [f.name for f in sent.file] == [f.name for f in reversed(files)]


def test_a_registry_that_fails_to_build_for_any_reason_leaves_the_store_open_and_names_why(
    config: StoreConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store(config) as store:
        store.register_types(descriptor_set_of(*chain(2)))
        store.put("untyped", b"kept")
    build_pool = descriptors.build_pool

    def failing(files: dict[str, descriptor_pb2.FileDescriptorProto]) -> descriptor_pool.DescriptorPool:
        if files:
            raise RecursionError("maximum recursion depth exceeded")
        return build_pool(files)

    monkeypatch.setattr(descriptors, "build_pool", failing)
    monkeypatch.setattr(crosscheck, "build_pool", failing)
    with Store(config) as store:
        assert store.get("untyped").state == b"kept"
        store.put("untyped", b"still written")
        with pytest.raises(DataLoss, match=r"the types table's files \(2\) do not build: RecursionError: maximum"):
            store.put("typed", b"\x08\x07", message_type="p0.M")
        with store.read() as txn:  # what `ckpt verify` reports
            (problem,) = crosscheck.CrossCheck(store, txn, None).run("types")
        assert problem.text.startswith("the registered files do not build: RecursionError: maximum"), problem


def test_a_long_chain_of_types_each_holding_the_next_is_written_and_read_typed(config: StoreConfig) -> None:
    # One file, types A0 .. A1999, each with a field of the next: protobuf makes a class's field types'
    # classes by recursion, past Python's limit for a chain this long unless made leaves first.
    f = descriptor_pb2.FileDescriptorProto(name="chain/t.proto", package="chain", syntax="proto3")
    for i in range(2000):
        m = f.message_type.add(name=f"A{i}")
        m.field.add(name="v", number=1, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
        if i + 1 < 2000:
            m.field.add(
                name="next", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=f".chain.A{i + 1}"
            )
    state = b"\x08\x05\x12\x02\x08\x06"  # v: 5, next {v: 6}
    with Store(config) as store:
        store.register_types(descriptor_pb2.FileDescriptorSet(file=[f]).SerializeToString())
        store.put("s", state, message_type="chain.A0")
        store.put("s", b"\x08\x07", mode=WriteMode.MERGE)
    with Store(config) as store:  # cold: the classes made again on a fresh registry
        got = store.get("s")
        assert got.info.message_type == "chain.A0"
        cls: Any = store.current_message_class("chain.A0")
        assert cls.FromString(got.state).next.v == 6
        store.put("t", b"\x08\x01", message_type="chain.A1999")
