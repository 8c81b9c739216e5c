"""Where a message's encoding holds a string field that is not UTF-8.

protobuf refuses such a message whole ("String field had bad UTF-8") without naming the field. A client in
another language can send one (its own runtime may not check), and a refusal should say which field: this
walks the encoding against the message's descriptor and names the first string whose bytes do not decode.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from .errors import WireFormatError
from .wire import field_spans

_WIRE_LEN = 2
#: A message's descriptor: protobuf's Python class or its upb one (typed apart, the same calls).
Descriptor = Any


def _payload(data: memoryview, start: int) -> memoryview:
    """A length-delimited field's bytes, its tag and length at ``start`` skipped."""
    pos = start
    for _ in range(2):  # the tag, then the length: field_spans has checked both
        while data[pos] & 0x80:
            pos += 1
        pos += 1
    return data[pos:]


def invalid_utf8_field(data: bytes, descriptor: Descriptor) -> tuple[str, int] | None:
    """The first string field of ``data`` (a ``descriptor`` message's encoding) whose bytes are not UTF-8: its
    path (``labels key``, ``events[1].type``, ``put.request_id``) and the offset of its bytes in ``data``.
    None if there is none, or if the encoding is not well-formed before one is found."""
    try:
        return _walk(memoryview(data), 0, descriptor, "")
    except WireFormatError:
        return None


def _walk(data: memoryview, base: int, descriptor: Descriptor, prefix: str) -> tuple[str, int] | None:
    seen: dict[int, int] = {}
    for number, wire, start, end in field_spans(data):
        field = descriptor.fields_by_number.get(number)
        if field is None or wire != _WIRE_LEN:
            continue
        index = seen.get(number, 0)
        seen[number] = index + 1
        payload = _payload(data[:end], start)
        at = base + end - len(payload)
        name = prefix + field.name
        if field.type == FieldDescriptor.TYPE_STRING:
            try:
                str(payload, "utf-8")
            except UnicodeDecodeError:
                return (f"{name}[{index}]" if _repeated(field) else name), at
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            entry = field.message_type
            if entry.GetOptions().map_entry:
                found = _map_entry(payload, at, entry, name)
            else:
                found = _walk(payload, at, entry, f"{name}[{index}]." if _repeated(field) else f"{name}.")
            if found is not None:
                return found
    return None


def _map_entry(data: memoryview, base: int, entry: Descriptor, name: str) -> tuple[str, int] | None:
    key = ""
    for number, wire, start, end in field_spans(data):
        if wire != _WIRE_LEN or number not in (1, 2):
            continue
        payload = _payload(data[:end], start)
        at = base + end - len(payload)
        field = entry.fields_by_number[number]
        if field.type == FieldDescriptor.TYPE_STRING:
            try:
                text = str(payload, "utf-8")
            except UnicodeDecodeError:
                return (f"{name} key" if number == 1 else f"{name}[{key!r}] value"), at
            if number == 1:
                key = text
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            found = _walk(payload, at, field.message_type, f"{name}[{key!r}].")
            if found is not None:
                return found
    return None


def _repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)
