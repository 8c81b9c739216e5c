"""Field-masked reads: the fields a ``google.protobuf.FieldMask`` names, taken from a state's bytes.

The result is what protobuf's own ``FieldMask.MergeMessage`` makes of the
parsed state into an empty message (the oracle of the property tests), but
the state is not parsed whole: an agent booting from its handoff note and
plan should not pay for decoding its long history. A top-level field named
whole is kept as its bytes, found by scanning the top level of the wire
format (wire.py): every occurrence, in order, since a MERGE state is a
concatenation of patches until it is compacted, and parsing the kept
occurrences merges them as parsing the whole state would (sub-messages
merge, scalars last wins, repeated fields and maps append). Only what a path
into a sub-message (``handoff.next``) needs is parsed: the occurrences of its
top-level field, then protobuf's own FieldMask logic on that small message.
A closed enum's value the enum lacks is an unknown field to a parser: the
scan skips it (it does not set its oneof), and a closed enum field, or a map
of one, is parsed rather than kept as its bytes.

Byte for byte the result may differ from the oracle's serialization (the
occurrences are kept as written); as a message it is equal.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor as _descriptor
from google.protobuf import field_mask_pb2
from google.protobuf import message as _message

from .errors import FieldMaskError, MaskedStateError
from .wire import field_spans

_FD = _descriptor.FieldDescriptor
_VARINT, _I64, _LEN, _SGROUP, _I32 = 0, 1, 2, 3, 5
_WIRE_OF_TYPE = {
    _FD.TYPE_DOUBLE: _I64,
    _FD.TYPE_FLOAT: _I32,
    _FD.TYPE_INT64: _VARINT,
    _FD.TYPE_UINT64: _VARINT,
    _FD.TYPE_INT32: _VARINT,
    _FD.TYPE_FIXED64: _I64,
    _FD.TYPE_FIXED32: _I32,
    _FD.TYPE_BOOL: _VARINT,
    _FD.TYPE_STRING: _LEN,
    _FD.TYPE_GROUP: _SGROUP,
    _FD.TYPE_MESSAGE: _LEN,
    _FD.TYPE_BYTES: _LEN,
    _FD.TYPE_UINT32: _VARINT,
    _FD.TYPE_ENUM: _VARINT,
    _FD.TYPE_SFIXED32: _I32,
    _FD.TYPE_SFIXED64: _I64,
    _FD.TYPE_SINT32: _VARINT,
    _FD.TYPE_SINT64: _VARINT,
}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: A mask's paths as a tree of field names; a leaf keeps its field whole.
_Tree = dict[str, "_Tree"]
#: Paths per mask: a mask names fields of one message, and a message has few.
MAX_PATHS = 1000
#: The nested messages a path may go into (its dots): as deep as protobuf parses messages (upb's limit, which
#: a typed session's states and MERGE patches are held to), so no state has a field deeper.
MAX_PATH_DEPTH = 100


def check_paths(paths: Iterable[str]) -> tuple[str, ...]:
    """The paths, each a dot-separated run of field names; FieldMaskError naming the first that is not."""
    out = tuple(paths)
    if len(out) > MAX_PATHS:
        raise FieldMaskError(f"field_mask has {len(out)} paths; the limit is {MAX_PATHS}")
    for path in out:
        names = path.split(".")
        if len(names) > MAX_PATH_DEPTH + 1:
            shown = repr(path) if len(path) <= 100 else f"{path[:100]!r}... ({len(path)} characters)"
            raise FieldMaskError(
                f"field_mask path {shown} goes {len(names) - 1} messages deep; the limit is {MAX_PATH_DEPTH}"
                " (protobuf parses messages nested no deeper)"
            )
        if not all(_NAME.fullmatch(name) for name in names):
            raise FieldMaskError(
                f"field_mask path {path!r} is malformed: it must be field names separated by dots (e.g. 'handoff',"
                " 'handoff.next')"
            )
    return out


@dataclass(frozen=True, slots=True)
class FieldMask:
    """A mask checked against a message type: :meth:`apply` keeps its fields of a state of that type.

    Build one with :func:`compile_mask` (which checks every path against the type's descriptor).
    """

    message_type: type[_message.Message]
    #: The mask's paths, canonical (sorted, none under another).
    paths: tuple[str, ...]
    #: The top-level fields the scan collects: field number -> the wire types a parser reads as it.
    scanned: dict[int, frozenset[int]]
    #: Of those, the fields kept as their bytes...
    raw: frozenset[int]
    #: ... and those parsed, for the paths under them (or, a closed enum, for its known values alone).
    parsed: frozenset[int]
    parsed_paths: tuple[str, ...]
    #: Members of the real oneofs of kept fields: field number -> its oneof (setting one clears the others).
    oneof_of: dict[int, int]
    #: Of the scanned fields, the singular closed enums: field number -> the values the enum has. Another
    #: value goes to the unknown fields and, in a oneof, leaves the member set before it as it is.
    closed_values: dict[int, frozenset[int]]

    def apply(self, state: bytes | memoryview) -> bytes:
        """The masked state: ``state`` (a serialized message of :attr:`message_type`) with every other field
        cleared. WireFormatError naming the offset if ``state`` is not well-formed wire format; MaskedStateError
        if the fields a path goes into do not parse as :attr:`message_type` (fields kept whole are not parsed)."""
        scanned, oneof_of = self.scanned, self.oneof_of
        spans: dict[int, list[tuple[int, int]]] = {}
        winner: dict[int, int] = {}  # oneof -> the member set last
        view = memoryview(state)
        for field, wire, start, end in field_spans(view):
            wires = scanned.get(field)
            if wires is None or wire not in wires:
                continue  # another field, or bytes a parser keeps as an unknown field
            known = self.closed_values.get(field)
            if known is not None and _int32_value(view, start) not in known:
                continue  # a closed enum's unknown value: an unknown field too
            oneof = oneof_of.get(field)
            if oneof is not None and winner.get(oneof) != field:
                winner[oneof] = field  # a member set anew starts empty; the others are cleared
                spans[field] = []
            spans.setdefault(field, []).append((start, end))
        for field, oneof in oneof_of.items():
            if winner.get(oneof) != field:
                spans.pop(field, None)
        kept = [view[start:end] for field in sorted(spans) if field in self.raw for start, end in spans[field]]
        if self.parsed:
            sub = b"".join(
                view[start:end] for field in sorted(spans) if field in self.parsed for start, end in spans[field]
            )
            kept.append(memoryview(self._merge_parsed(sub, sorted(spans.keys() & self.parsed))))
        return b"".join(kept)

    def _merge_parsed(self, sub: bytes, numbers: list[int]) -> bytes:
        try:
            source = self.message_type.FromString(sub)
        except _message.DecodeError as exc:
            fields = self.message_type.DESCRIPTOR.fields_by_number
            names = ", ".join(f"{n} ({fields[n].name})" for n in numbers)
            detail = str(exc).rpartition("': ")[2] or str(exc)
            which = f"field {names} does" if len(numbers) == 1 else f"fields {names} do"
            raise MaskedStateError(
                f"{self.message_type.DESCRIPTOR.full_name}'s {which} not parse as declared ({len(sub)} bytes): {detail}"
            ) from None
        out = self.message_type()
        field_mask_pb2.FieldMask(paths=self.parsed_paths).MergeMessage(source, out)
        return out.SerializePartialToString()


def compile_mask(message_type: type[_message.Message], paths: Iterable[str]) -> FieldMask:
    """The mask of ``paths`` on ``message_type``; FieldMaskError naming the path for a malformed one, a field
    the type (or the message a path goes through) does not have, or a path below a field that is not a
    singular message."""
    descriptor = message_type.DESCRIPTOR
    tree: _Tree = {}  # protobuf's FieldMaskTree rule: a path under a kept one adds nothing
    for path in sorted(set(check_paths(paths)), key=lambda p: p.count(".")):
        message: Any = descriptor
        names = path.split(".")
        for depth, name in enumerate(names):
            field = message.fields_by_name.get(name)
            if field is None:
                raise FieldMaskError(f"field_mask path {path!r}: {message.full_name} has no field {name!r}")
            if depth < len(names) - 1:
                if field.is_repeated or field.cpp_type != _FD.CPPTYPE_MESSAGE:
                    raise FieldMaskError(
                        f"field_mask path {path!r}: {message.full_name}.{name} is not a singular message field,"
                        " so no path goes below it"
                    )
                message = field.message_type
        node = tree
        for name in names:
            if name in node and not node[name]:
                break  # a shorter path keeps it whole already
            node = node.setdefault(name, {})
        else:
            node.clear()
    scanned: dict[int, frozenset[int]] = {}
    raw: set[int] = set()
    parsed: set[int] = set()
    parsed_paths: list[str] = []
    oneof_of: dict[int, int] = {}
    closed_values: dict[int, frozenset[int]] = {}
    for name, node in tree.items():
        field = descriptor.fields_by_name[name]
        scanned[field.number] = _wires(field)
        if node or _closed_enum(field) is not None:
            # A closed enum's unknown values go to the unknown fields (a map's entry whole): its bytes would
            # bring them back.
            parsed.add(field.number)
            parsed_paths.extend(_leaves(name, node))
        else:
            raw.add(field.number)
        oneof = field.containing_oneof
        if oneof is not None and len(oneof.fields) > 1:  # not a proto3 optional's oneof of one
            for member in oneof.fields:
                oneof_of[member.number] = oneof.index
                scanned.setdefault(member.number, _wires(member))  # kept or not: setting it clears the kept one
    for number in scanned:
        field = descriptor.fields_by_number[number]
        if not field.is_repeated and field.enum_type is not None and field.enum_type.is_closed:
            closed_values[number] = frozenset(field.enum_type.values_by_number)
    return FieldMask(
        message_type=message_type,
        paths=tuple(_leaves("", tree)),
        scanned=scanned,
        raw=frozenset(raw),
        parsed=frozenset(parsed),
        parsed_paths=tuple(parsed_paths),
        oneof_of=oneof_of,
        closed_values=closed_values,
    )


def _closed_enum(field: Any) -> Any:
    """The closed enum ``field`` holds (or a map field, as its values), or None."""
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        field = field.message_type.fields_by_name["value"]
    enum = field.enum_type
    return enum if enum is not None and enum.is_closed else None


def _int32_value(view: memoryview, start: int) -> int:
    """The value of the varint field whose tag is at ``start``, as a parser reads an enum: its low 32 bits,
    signed."""
    pos = start
    while view[pos] & 0x80:  # the tag
        pos += 1
    pos += 1
    value = shift = 0
    while True:
        byte = view[pos]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        pos += 1
        shift += 7
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def _wires(field: Any) -> frozenset[int]:
    """The wire types a parser reads as ``field`` (a repeated number also packed); others are unknown fields."""
    wire = _WIRE_OF_TYPE[field.type]
    if field.is_repeated and wire != _LEN and wire != _SGROUP:
        return frozenset((wire, _LEN))
    return frozenset((wire,))


def _leaves(prefix: str, node: _Tree) -> list[str]:
    if not node:
        return [prefix] if prefix else []
    out: list[str] = []
    for name in sorted(node):
        out.extend(_leaves(f"{prefix}.{name}" if prefix else name, node[name]))
    return out
