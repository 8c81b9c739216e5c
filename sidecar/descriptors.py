"""Message types from FileDescriptorSets: the built-in files, a set's checks, a pool of files, what a
re-registration may change, and a message class's set. No storage here (store/registry.py keeps the files).

A pool is protobuf's own (descriptor_pool.DescriptorPool): its dynamic message classes parse, validate and
serialize a typed session's states as generated code would. Each generation of a registry builds a pool of
its own, the built-in files first: a pool never takes a second, different file under one name, and a
re-registered file must replace the old one whole.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType

from google.protobuf import (
    any_pb2,
    descriptor,
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    empty_pb2,
    field_mask_pb2,
    message_factory,
    struct_pb2,
    timestamp_pb2,
    wrappers_pb2,
)
from google.protobuf.message import DecodeError, Message

from ckpt.v1 import checkpoint_pb2

from .errors import FailedPrecondition, InvalidArgument

FileProto = descriptor_pb2.FileDescriptorProto

#: The largest FileDescriptorSet a registration takes: a schema with its imports is kilobytes (google's
#: descriptor.proto, among the largest, ~10 KB serialized); this leaves room for large ones, and bounds
#: what the writer thread builds a pool from while writes wait.
MAX_DESCRIPTOR_SET_BYTES = 4 * 1024 * 1024
#: The longest message type name a put may give.
MAX_TYPE_NAME_BYTES = 512
#: The longest file name a set may hold (a key of the `types` table).
MAX_FILE_NAME_BYTES = 256
_TYPE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")

# Known without registration: the default state's file and what it imports, and protobuf's well-known types.
_BUILT_IN_MODULES: tuple[ModuleType, ...] = (
    checkpoint_pb2,
    any_pb2,
    duration_pb2,
    empty_pb2,
    field_mask_pb2,
    struct_pb2,
    timestamp_pb2,
    wrappers_pb2,
    descriptor_pb2,  # for custom options
)


def _with_imports(files: Iterable[descriptor.FileDescriptor]) -> Iterator[descriptor.FileDescriptor]:
    """``files`` and every file they import, each after its imports, once (a loop: an import chain may be
    longer than Python's recursion limit)."""
    seen: set[str] = set()
    for root in files:
        if root.name in seen:
            continue
        seen.add(root.name)
        stack = [(root, iter(root.dependencies))]
        while stack:
            f, deps = stack[-1]
            dep = next((d for d in deps if d.name not in seen), None)
            if dep is None:
                stack.pop()
                yield f
            else:
                seen.add(dep.name)
                stack.append((dep, iter(dep.dependencies)))


def _built_in() -> dict[str, FileProto]:
    out = {}
    for f in _with_imports(m.DESCRIPTOR for m in _BUILT_IN_MODULES):
        proto = FileProto()
        f.CopyToProto(proto)
        out[f.name] = proto
    return out


#: The built-in files by name, each after the files it imports.
BUILT_IN_FILES: Mapping[str, FileProto] = _built_in()


def check_type_name(name: str, *, field: str = "message_type") -> None:
    """InvalidArgument unless ``name`` reads as a message type's full name (``acme.agent.v1.State``)."""
    if not isinstance(name, str):
        raise InvalidArgument(f"{field} must be a string, not {type(name).__name__}")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_TYPE_NAME_BYTES or not _TYPE_NAME.fullmatch(name):
        raise InvalidArgument(
            f"{field} {_quoted(name)} is not a message type's full name (e.g. acme.agent.v1.State: dot-separated"
            f" identifiers, at most {MAX_TYPE_NAME_BYTES} bytes)"
        )


def _quoted(text: str, limit: int = 100) -> str:
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def is_built_in_type(name: str) -> bool:
    """Whether ``name`` is a message type of a built-in file (ckpt.v1.Checkpoint, google.protobuf's)."""
    try:
        return descriptor_pool.Default().FindMessageTypeByName(name).file.name in BUILT_IN_FILES
    except KeyError:
        return False


def descriptor_set(message: type[Message] | Message | descriptor.Descriptor) -> bytes:
    """The serialized FileDescriptorSet registering ``message``'s type: its file and every file that file
    imports, each after its imports (what RegisterType takes)."""
    desc = message if isinstance(message, descriptor.Descriptor) else getattr(message, "DESCRIPTOR", None)
    if not isinstance(desc, descriptor.Descriptor):
        raise TypeError(f"expected a protobuf message class, message or Descriptor, not {type(message).__name__}")
    out = descriptor_pb2.FileDescriptorSet()
    for f in _with_imports([desc.file]):
        f.CopyToProto(out.file.add())
    return out.SerializeToString(deterministic=True)


def parse_set(data: bytes) -> list[FileProto]:
    """The files of a serialized FileDescriptorSet, checked alone (InvalidArgument naming what is wrong)."""
    if len(data) > MAX_DESCRIPTOR_SET_BYTES:
        raise InvalidArgument(
            f"file_descriptor_set is {len(data)} bytes; the limit is {MAX_DESCRIPTOR_SET_BYTES} (4 MiB): send a"
            " type's files without ones the sidecar knows already"
        )
    try:
        files = list(descriptor_pb2.FileDescriptorSet.FromString(data).file)
    except DecodeError as exc:
        detail = str(exc).rpartition("': ")[2]  # without protobuf's "Error parsing message with type ..."
        raise InvalidArgument(
            f"file_descriptor_set ({len(data)} bytes) does not parse as a google.protobuf.FileDescriptorSet: {detail}"
        ) from None
    if not files:
        raise InvalidArgument(
            "file_descriptor_set holds no files: send the file defining the type and the files it imports"
        )
    names: set[str] = set()
    for i, f in enumerate(files):
        # descriptor.proto is proto2: a string that is not UTF-8 parses, and reads back as bytes.
        if isinstance(f.name, bytes):
            raise InvalidArgument(f"file_descriptor_set's file {i} has a name that is not UTF-8: {f.name!r}")
        if not f.name:
            raise InvalidArgument(f"file_descriptor_set's file {i} has no name")
        for dep in f.dependency:
            if isinstance(dep, bytes):
                raise InvalidArgument(f"file {f.name!r} imports a file whose name is not UTF-8: {dep!r}")
        if len(f.name.encode()) > MAX_FILE_NAME_BYTES:
            raise InvalidArgument(
                f"file_descriptor_set's file {i} has a name of {len(f.name.encode())} bytes; the limit is"
                f" {MAX_FILE_NAME_BYTES}"
            )
        if f.name in names:
            raise InvalidArgument(f"file_descriptor_set holds file {f.name!r} twice")
        names.add(f.name)
    return files


def definition(f: FileProto) -> bytes:
    """What a file defines, for telling two versions of it apart: its bytes without what compilers add or
    drop on their own (source locations, JSON names) or set per language (file options)."""
    copy = FileProto()
    copy.CopyFrom(f)
    copy.ClearField("source_code_info")
    copy.ClearField("options")
    for message in _messages(copy.message_type):
        for field in (*message.field, *message.extension):
            field.ClearField("json_name")
    for field in copy.extension:
        field.ClearField("json_name")
    return copy.SerializeToString(deterministic=True)


def _messages(messages: Iterable[descriptor_pb2.DescriptorProto]) -> Iterator[descriptor_pb2.DescriptorProto]:
    for m in messages:
        yield m
        yield from _messages(m.nested_type)


def build_pool(files: Mapping[str, FileProto]) -> descriptor_pool.DescriptorPool:
    """A pool of the built-in files and ``files`` (by name), each added after its imports, whatever order
    ``files`` has and however long its import chains are (a loop, not recursion).

    InvalidArgument when a file imports one that is neither among them nor built in, files import each
    other in a circle, or protobuf refuses a file (naming it and why).
    """
    pool = descriptor_pool.DescriptorPool()
    for f in BUILT_IN_FILES.values():
        pool.Add(f)
    added: set[str] = set(BUILT_IN_FILES)
    for root in files:
        if root in added:
            continue
        # The files being added, each with its imports not yet looked at: the chain from ``root``.
        stack = [(root, iter(files[root].dependency))]
        visiting = {root}
        while stack:
            name, deps = stack[-1]
            dep = next((d for d in deps if d not in added), None)
            if dep is None:
                stack.pop()
                visiting.discard(name)
                try:
                    pool.Add(files[name])
                except Exception as exc:  # upb raises TypeError, the pure-Python pool others
                    raise InvalidArgument(f"protobuf refuses file {name!r}: {exc}") from None
                added.add(name)
                continue
            imported = files.get(dep)
            if imported is None:
                raise InvalidArgument(
                    f"file {name!r} imports {dep!r}, which is neither in the set nor registered nor built in:"
                    " send it too"
                )
            if dep in visiting:
                raise InvalidArgument(f"file {dep!r} imports itself, through {name!r}")
            visiting.add(dep)
            stack.append((dep, iter(imported.dependency)))
    return pool


def message_class(message: descriptor.Descriptor) -> type[Message]:
    """``message``'s dynamic class, the classes of the message types its fields hold made first, leaves
    first: protobuf makes a class's field types' classes by recursion, and a chain of a few hundred types
    each holding the next would pass Python's recursion limit (a RegisterType any client may send)."""
    order: list[descriptor.Descriptor] = []
    seen = {message.full_name}
    stack = [(message, iter(message.fields))]
    while stack:
        current, fields = stack[-1]
        child = next((f.message_type for f in fields if f.message_type is not None), None)
        if child is None:
            stack.pop()
            order.append(current)
        elif child.full_name not in seen:
            seen.add(child.full_name)
            stack.append((child, iter(child.fields)))
    for each in order:
        cls = message_factory.GetMessageClass(each)
    return cls


def message_types(files: Iterable[FileProto], pool: descriptor_pool.DescriptorPool) -> list[str]:
    """The full names of the message types ``files`` define (in ``pool``), nested ones too but map entries, sorted."""
    out: list[str] = []

    def visit(message: descriptor.Descriptor) -> None:
        if message.GetOptions().map_entry:
            return
        out.append(message.full_name)
        for nested in message.nested_types:
            visit(nested)

    for f in files:
        for message in pool.FindFileByName(f.name).message_types_by_name.values():
            visit(message)
    return sorted(out)


def check_compatible(
    old_pool: descriptor_pool.DescriptorPool,
    new_pool: descriptor_pool.DescriptorPool,
    replaced: Iterable[str],
) -> None:
    """FailedPrecondition unless each message the files ``replaced`` defined in ``old_pool`` is still
    defined in ``new_pool`` (what its fields may change is :func:`check_field_uses`'s)."""
    for name in replaced:
        for message in old_pool.FindFileByName(name).message_types_by_name.values():
            _check_message(message, new_pool, name)


def _check_message(old: descriptor.Descriptor, new_pool: descriptor_pool.DescriptorPool, file_name: str) -> None:
    if old.GetOptions().map_entry:
        return  # its field's kind says what it holds
    try:
        new_pool.FindMessageTypeByName(old.full_name)
    except KeyError:
        raise FailedPrecondition(
            f"message {old.full_name} (of file {file_name!r}) is no longer defined: sessions of that type could not be"
            " read as it; keep it (fields and messages may be added)"
        ) from None
    for nested in old.nested_types:
        _check_message(nested, new_pool, file_name)


#: A field number of a message (an extension's: of the message it extends).
FieldKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class FieldUse:
    """What a field number of a message holds: its kind (:func:`kind_of`'s words, which the `meta` table's
    field history stores: change them only with a migration) and the name it was registered under."""

    kind: str
    #: The field's name; an extension's full name.
    name: str
    extension: bool = False


def field_uses(pool: descriptor_pool.DescriptorPool, file_names: Iterable[str]) -> dict[FieldKey, FieldUse]:
    """Every field number the files ``file_names`` (in ``pool``) give a message, their extensions' included
    (under the message they extend), nested messages' too but map entries'."""
    out: dict[FieldKey, FieldUse] = {}

    def extension(ext: descriptor.FieldDescriptor) -> None:
        extendee = ext.containing_type
        assert extendee is not None  # an extension's is the message it extends
        out[(extendee.full_name, ext.number)] = FieldUse(kind_of(ext), ext.full_name, extension=True)

    def visit(message: descriptor.Descriptor) -> None:
        if message.GetOptions().map_entry:
            return
        for f in message.fields:
            out[(message.full_name, f.number)] = FieldUse(kind_of(f), f.name)
        for ext in message.extensions:
            extension(ext)
        for nested in message.nested_types:
            visit(nested)

    for name in file_names:
        f = pool.FindFileByName(name)
        for message in f.message_types_by_name.values():
            visit(message)
        for ext in f.extensions_by_name.values():
            extension(ext)
    return out


def check_field_uses(
    known: Mapping[FieldKey, FieldUse], new: Mapping[FieldKey, FieldUse], current: Mapping[FieldKey, FieldUse]
) -> None:
    """FailedPrecondition naming the first field number ``new`` gives another kind than ``known`` does
    (every number ever registered, removed fields' too); ``current``: those registered now, the others'
    fields were removed since. A string that stops being UTF-8 validated is the one change taken: its
    stored values are valid UTF-8, while one starting to be may find stored values that are not."""
    for key, now in sorted(new.items()):
        was = known.get(key)
        if was is None or was.kind == now.kind or _drops_utf8_checks(was.kind, now.kind):
            continue
        message, number = key
        what = "extension" if now.extension else "field"
        before = f", named {was.name!r} before" if was.name != now.name else ""
        removed = "" if key in current else ", removed since"
        if _unchecked_at(was.kind)[0] == _unchecked_at(now.kind)[0]:
            why = (
                "a string not UTF-8 validated stays so for good (stored states may hold other bytes, which a"
                " validating parse refuses): keep the field unchecked (proto2, or features.utf8_validation ="
                " NONE), or give the new field another number"
            )
        else:
            why = (
                "a field number keeps its type and cardinality for good, even once its field is removed (stored"
                " states hold it): give the new field another number"
            )
        raise FailedPrecondition(
            f"message {message}: {what} {now.name!r} (number {number}{before}{removed}) would change from"
            f" {was.kind} to {now.kind}; {why}"
        )


_SCALARS = {
    value.number: value.name.removeprefix("TYPE_").lower()
    for value in descriptor_pb2.FieldDescriptorProto.Type.DESCRIPTOR.values
}


#: What follows ``string`` in a kind when the field's values are not UTF-8 validated (proto2, or an
#: editions file's ``utf8_validation = NONE``): a parse of them takes any bytes, proto3's refuses others.
UNCHECKED_UTF8 = " (no UTF-8 check)"


def kind_of(field: descriptor.FieldDescriptor) -> str:
    """A field's type and cardinality in words (``repeated string``, ``map<string, acme.Entity>``), a string
    not UTF-8 validated marked (``string (no UTF-8 check)``)."""
    entry = field.message_type
    if entry is not None and entry.GetOptions().map_entry:
        return f"map<{_element(entry.fields_by_number[1])}, {_element(entry.fields_by_number[2])}>"
    return f"repeated {_element(field)}" if field.is_repeated else _element(field)


def _element(field: descriptor.FieldDescriptor) -> str:
    if field.message_type is not None:
        return ("group " if field.type == descriptor.FieldDescriptor.TYPE_GROUP else "") + field.message_type.full_name
    if field.enum_type is not None:
        return f"enum {field.enum_type.full_name}"
    if field.type == descriptor.FieldDescriptor.TYPE_STRING and not _utf8_validated(field):
        return "string" + UNCHECKED_UTF8
    return _SCALARS[field.type]


def _utf8_validated(field: descriptor.FieldDescriptor) -> bool:
    """Whether a parse refuses a string field's values that are not UTF-8: its resolved features' say
    (proto3: VERIFY, proto2: NONE, editions: ``features.utf8_validation``, the file's default by default)."""
    features = field._GetFeatures()  # type: ignore[attr-defined]  # resolved features: no public accessor
    return bool(features.utf8_validation != descriptor_pb2.FeatureSet.NONE)


def _drops_utf8_checks(was: str, now: str) -> bool:
    """Whether kind ``now`` is ``was`` with some of its strings no longer UTF-8 validated, and no other change."""
    was_plain, was_marks = _unchecked_at(was)
    now_plain, now_marks = _unchecked_at(now)
    return was_plain == now_plain and was_marks < now_marks


def _unchecked_at(kind: str) -> tuple[str, set[int]]:
    """``kind`` without its :data:`UNCHECKED_UTF8` marks, and where in that they were (no type name holds one)."""
    parts = kind.split(UNCHECKED_UTF8)
    marks, at = set(), 0
    for part in parts[:-1]:
        at += len(part)
        marks.add(at)
    return "".join(parts), marks


def where_unparsed(data: bytes, message_class: type[Message]) -> str:
    """Where well-framed ``data`` fails to parse as ``message_class``: the first top-level field that does
    not parse alone ("field 1 (entities) at offset 0: ..."), or "" when none does (or a group hides it)."""
    pos = 0
    fields = message_class.DESCRIPTOR.fields_by_number
    while pos < len(data):
        start = pos
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _varint(data, pos)
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        elif wire == 2:
            length, pos = _varint(data, pos)
            pos += length
        else:
            return ""  # a group: left to the parser's own words
        try:
            message_class.FromString(data[start:pos])
        except DecodeError as exc:
            name = f" ({fields[number].name})" if number in fields else ""
            detail = str(exc).rpartition("': ")[2] or str(exc)
            return f"field {number}{name} at offset {start}: {detail}"
    return ""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        result |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            return result, pos
        shift += 7
