"""Protobuf wire-format scanning: checks for MERGE patches, and where each top-level field lies.

A MERGE write stores ``new = previous + patch``; a patch that is not
well-formed wire format would make every later version unparseable, so it is
refused before anything is written. Only the top level is checked (the store
does not know the message type): each field's tag, wire type and length must
be valid and the last field must end exactly at the end of the patch, which is
what concatenation needs. Nested messages are checked too when the caller
passes a message type.
"""

from __future__ import annotations

from collections.abc import Iterator

from google.protobuf import message as _message

from .errors import WireFormatError

_WIRE_VARINT, _WIRE_I64, _WIRE_LEN, _WIRE_SGROUP, _WIRE_EGROUP, _WIRE_I32 = range(6)
# What protobuf's parsers (upb, which the store's compaction uses) accept: tags
# and lengths are 32-bit varints of at most 5 bytes, values at most 10 bytes,
# and groups nest at most 100 deep (the default recursion limit). A patch past
# any of these would make every later version of the session unparseable.
_MAX_VARINT_BYTES = 10
_MAX_VARINT32_BYTES = 5
MAX_GROUP_DEPTH = 100


def check_patch(patch: bytes, *, message_type: type[_message.Message] | None = None) -> None:
    """Raise WireFormatError (naming the byte offset) unless ``patch`` is well-formed.

    The framing is checked by a scan in Python (about 1.5 us for a typical
    agent-step patch), not by the C parser: upb accepts a zero tag in a
    message with no fields (``google.protobuf.Empty``), which would let a patch
    through that truncates every later version.
    """
    _scan(patch)
    if message_type is not None:
        try:
            message_type.FromString(patch)
        except _message.DecodeError as exc:
            raise WireFormatError(
                f"patch of {len(patch)} bytes does not parse as {message_type.DESCRIPTOR.full_name}: {exc}", offset=0
            ) from None


def _varint(data: bytes | memoryview, pos: int, field: int, part: str, limit: int) -> tuple[int, int]:
    """The varint at ``pos`` and the offset after it; ``field`` and ``part`` name it in an error
    (field 0: a tag), so that the scan of a well-formed message never builds that name."""
    start = pos
    result = shift = 0
    while True:
        if pos >= len(data) or pos - start >= limit:
            what = "tag" if not field else f"field {field} {part}"
            if pos >= len(data):
                raise WireFormatError(
                    f"truncated {what} varint at offset {start}, the end of the {len(data)} bytes", offset=start
                )
            raise WireFormatError(f"{what} varint at offset {start} is longer than {limit} bytes", offset=start)
        byte = data[pos]
        result |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            return result, pos
        shift += 7


def count_fields(data: bytes, field_number: int, *, stop: int) -> int:
    """How many length-delimited fields numbered ``field_number`` ``data`` holds at its top level (not
    inside a group), counting no further than ``stop``. Wire format that is not well-formed ends the
    count: a parser then says what is wrong (a sidecar counts a request's repeated field before it
    parses it, to refuse one of too many entries without building them)."""
    count = 0
    try:
        for field, wire, depth, _, _ in _fields(data):
            if field == field_number and wire == _WIRE_LEN and not depth:
                count += 1
                if count >= stop:
                    break
    except WireFormatError:
        pass
    return count


def field_spans(data: bytes | memoryview) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, start, end) of each top-level field in turn: ``data[start:end]`` is the
    field whole, its tag included (a group from its start tag to its end tag). WireFormatError naming
    the offset at the first malformed one: a field-masked read keeps fields by their bytes, unparsed."""
    group_at = 0
    for field, wire, depth, tag_at, end in _fields(data):
        if wire == _WIRE_SGROUP:
            if depth == 1:
                group_at = tag_at
        elif not depth:
            if wire == _WIRE_EGROUP:
                yield field, _WIRE_SGROUP, group_at, end
            else:
                yield field, wire, tag_at, end


def _scan(data: bytes) -> None:
    """Read the top-level fields in order; raise at the first malformed one."""
    for _ in _fields(data):
        pass


def _fields(data: bytes | memoryview) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, groups open around it, offset of its tag, offset after it) of each field
    in turn (a group's start tag counted inside it, its end tag outside); WireFormatError naming the offset at
    the first malformed one (or at the end, for a group left open)."""
    pos = 0
    size = len(data)
    open_groups: list[tuple[int, int]] = []  # (field number, offset of its start tag)
    # Tags and lengths of one or two bytes (fields 1-2047, lengths under 16 KiB) are read inline: a
    # call per varint made the scan of a 500 KB state slower than parsing it.
    while pos < size:
        tag_at = pos
        key = data[pos]
        if key < 0x80:
            pos += 1
        elif pos + 1 < size and data[pos + 1] < 0x80:
            key = (key & 0x7F) | data[pos + 1] << 7
            pos += 2
        else:
            key, pos = _varint(data, pos, 0, "", _MAX_VARINT32_BYTES)
        field, wire = key >> 3, key & 7
        if field == 0 or field > 0x1FFFFFFF:
            raise WireFormatError(f"field number {field} at offset {tag_at} is outside 1..536870911", offset=tag_at)
        if wire == _WIRE_LEN:
            length = data[pos] if pos < size else 0x80
            if length < 0x80:
                pos += 1
            elif pos + 1 < size and data[pos + 1] < 0x80:
                length = (length & 0x7F) | data[pos + 1] << 7
                pos += 2
            else:
                length, pos = _varint(data, pos, field, "length", _MAX_VARINT32_BYTES)
            if pos + length > size:
                raise WireFormatError(
                    f"field {field} at offset {tag_at} declares {length} bytes, {size - pos} left", offset=tag_at
                )
            pos += length
        elif wire == _WIRE_VARINT:
            if pos < size and data[pos] < 0x80:
                pos += 1
            else:
                _, pos = _varint(data, pos, field, "value", _MAX_VARINT_BYTES)
        elif wire in (_WIRE_I64, _WIRE_I32):
            width = 8 if wire == _WIRE_I64 else 4
            if pos + width > size:
                raise WireFormatError(
                    f"field {field} at offset {tag_at} needs {width} bytes, {size - pos} left", offset=tag_at
                )
            pos += width
        elif wire == _WIRE_SGROUP:
            if len(open_groups) >= MAX_GROUP_DEPTH:
                raise WireFormatError(
                    f"group of field {field} at offset {tag_at} nests {len(open_groups) + 1} deep;"
                    f" protobuf parses at most {MAX_GROUP_DEPTH}",
                    offset=tag_at,
                )
            open_groups.append((field, tag_at))
        elif wire == _WIRE_EGROUP:
            if not open_groups or open_groups[-1][0] != field:
                raise WireFormatError(f"unmatched end-group for field {field} at offset {tag_at}", offset=tag_at)
            open_groups.pop()
        else:
            raise WireFormatError(f"invalid wire type {wire} for field {field} at offset {tag_at}", offset=tag_at)
        yield field, wire, len(open_groups), tag_at, pos
    if open_groups:
        field, at = open_groups[-1]
        raise WireFormatError(f"group of field {field} opened at offset {at} is never closed", offset=at)
