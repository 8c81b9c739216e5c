"""A msgpack array's bytes cut into its values' own bytes, without decoding them. No I/O.

A list serialized in one call holds each element's bytes as serializing that element alone gives them
(elements.py relies on it), so cutting the list's bytes apart gives every element's without serializing
any of them again. Only lengths are read: an ext value (how JsonPlusSerializer writes a message) is
stepped over whole, whatever it holds.
"""

from __future__ import annotations

# Values of a fixed size, by first byte: nil, false, true, float 32/64, uint 8-64, int 8-64, fixext 1-16.
_FIXED = {
    0xC0: 1, 0xC2: 1, 0xC3: 1,
    0xCA: 5, 0xCB: 9,
    0xCC: 2, 0xCD: 3, 0xCE: 5, 0xCF: 9,
    0xD0: 2, 0xD1: 3, 0xD2: 5, 0xD3: 9,
    0xD4: 3, 0xD5: 4, 0xD6: 6, 0xD7: 10, 0xD8: 18,
}  # fmt: skip
# Values whose length follows their first byte, by first byte: (bytes of the length, bytes between it and
# the data). bin 8-32, ext 8-32 (their type byte), str 8-32.
_SIZED = {
    0xC4: (1, 0), 0xC5: (2, 0), 0xC6: (4, 0),
    0xC7: (1, 1), 0xC8: (2, 1), 0xC9: (4, 1),
    0xD9: (1, 0), 0xDA: (2, 0), 0xDB: (4, 0),
}  # fmt: skip


class MsgpackSplitError(ValueError):
    """The bytes are not one msgpack array of whole values; names the offset."""


def split_array(data: bytes) -> list[bytes]:
    """The bytes of each value of the msgpack array ``data`` (which must be that array and nothing more)."""
    size = len(data)
    count, pos = _array_header(data)
    out: list[bytes] = []
    for _ in range(count):
        end = _skip(data, pos, size)
        out.append(data[pos:end])
        pos = end
    if pos != size:
        raise MsgpackSplitError(f"{size - pos} bytes follow the array's {count} values, at offset {pos}")
    return out


def _array_header(data: bytes) -> tuple[int, int]:
    if not data:
        raise MsgpackSplitError("no bytes: an array begins with its header")
    first = data[0]
    if 0x90 <= first <= 0x9F:
        return first & 0x0F, 1
    width = {0xDC: 2, 0xDD: 4}.get(first)
    if width is None or len(data) < 1 + width:
        raise MsgpackSplitError(f"not a msgpack array header at offset 0 (first byte 0x{first:02x})")
    return int.from_bytes(data[1 : 1 + width], "big"), 1 + width


def _skip(data: bytes, pos: int, size: int) -> int:
    """The offset after the value at ``pos``: one loop over the values it holds, counted, not recursed."""
    pending = 1
    while pending:
        if pos >= size:
            raise MsgpackSplitError(f"the array ends inside a value, at offset {pos} of {size}")
        first = data[pos]
        pending -= 1
        if first <= 0x7F or first >= 0xE0:  # positive and negative fixint
            pos += 1
        elif first <= 0x8F:  # fixmap: a key and a value per entry
            pending += 2 * (first & 0x0F)
            pos += 1
        elif first <= 0x9F:  # fixarray
            pending += first & 0x0F
            pos += 1
        elif first <= 0xBF:  # fixstr
            pos += 1 + (first & 0x1F)
        elif first in _FIXED:
            pos += _FIXED[first]
        elif first in _SIZED:
            width, extra = _SIZED[first]
            length = int.from_bytes(data[pos + 1 : pos + 1 + width], "big")
            pos += 1 + width + extra + length
        elif first in (0xDC, 0xDD, 0xDE, 0xDF):  # array 16/32, map 16/32
            width = 2 if first in (0xDC, 0xDE) else 4
            count = int.from_bytes(data[pos + 1 : pos + 1 + width], "big")
            pending += count * (2 if first >= 0xDE else 1)
            pos += 1 + width
        else:  # 0xc1: never used
            raise MsgpackSplitError(f"byte 0x{first:02x} at offset {pos} begins no msgpack value")
    if pos > size:
        raise MsgpackSplitError(f"the array ends inside a value, at offset {size} ({pos - size} bytes short)")
    return pos
