"""The rules session ids, request ids, labels and event types are checked by, wherever they are checked: by
the store before it writes (store/keys.py builds its keys of them), and by a client command line before it
sends."""

from __future__ import annotations

import re

from .errors import InvalidArgument

MAX_SESSION_ID_BYTES = 256
MAX_REQUEST_ID_BYTES = 128
#: Per write and per session (a session's labels are those of all its writes).
MAX_LABELS = 64
MAX_LABEL_KEY_BYTES = 63
#: The label index key is key NUL value NUL session: 63 + 1 + 128 + 1 + 256 =
#: 449 bytes, under LMDB's 511-byte key limit.
MAX_LABEL_VALUE_BYTES = 128
MAX_EVENT_TYPE_BYTES = 128


_CONTROL = re.compile("[\x00-\x1f\x7f]")


# What ids and labels are refused for (docs/errors.md states the same rule).
HAS_CONTROL = "contains an ASCII control character (U+0000-U+001F or U+007F)"
NOT_UTF8 = "is not valid UTF-8 (lone surrogate)"


#: How many characters of a client's string over its limit an error message quotes (a label key, a
#: page token): a request may carry megabytes there, and a status's details travel as one HTTP/2
#: header, which a client refuses past 16 KiB (and the store process's link past a message's size).
QUOTED_CHARS = 64


def quoted(text: str) -> str:
    """``repr(text)``, cut to its first QUOTED_CHARS characters (saying how long it was) if longer."""
    if len(text) <= QUOTED_CHARS:
        return repr(text)
    return f"{text[:QUOTED_CHARS]!r}... ({len(text)} characters)"


def has_control(text: str) -> bool:
    return _CONTROL.search(text) is not None  # ~7x faster than a per-character loop; runs on every write


def has_lone_surrogate(text: str) -> bool:
    """Whether ``text`` holds a lone surrogate (text decoded with surrogateescape): it has no UTF-8."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def session_key(session_id: str, *, field: str = "session_id") -> bytes:
    """Validate a session id and return its key bytes."""
    if not isinstance(session_id, str):
        raise InvalidArgument(f"{field} must be a string, not {type(session_id).__name__}")
    if not session_id:
        raise InvalidArgument(f"{field} is empty; it must be 1-{MAX_SESSION_ID_BYTES} bytes of UTF-8")
    return _id_bytes(session_id, field, MAX_SESSION_ID_BYTES)


def request_id_bytes(request_id: str) -> bytes:
    """Validate a (non-empty) request id and return its UTF-8 bytes, as session_key does a session id's."""
    return _id_bytes(request_id, "request_id", MAX_REQUEST_ID_BYTES)


def _id_bytes(value: str, field: str, limit: int) -> bytes:
    """``value``'s UTF-8 bytes, once they are within ``limit`` and hold no control character or lone surrogate."""
    raw = value.encode("utf-8", "surrogatepass")
    if len(raw) > limit:
        raise InvalidArgument(f"{field} is {len(raw)} bytes; the limit is {limit}")
    if has_control(value):
        raise InvalidArgument(f"{field} {quoted(value)} {HAS_CONTROL}")
    if has_lone_surrogate(value):
        raise InvalidArgument(f"{field} {quoted(value)} {NOT_UTF8}")
    return raw


def check_labels(labels: dict[str, str], *, field: str = "labels") -> None:
    if len(labels) > MAX_LABELS:
        raise InvalidArgument(f"{field} has {len(labels)} entries; the limit is {MAX_LABELS}")
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidArgument(f"{field} must map str to str; entry {key!r}: {value!r} does not")
        try:
            kb, vb = key.encode(), value.encode()
        except UnicodeEncodeError:
            raise InvalidArgument(f"{field} entry {quoted(key)} {NOT_UTF8}") from None
        if not kb or len(kb) > MAX_LABEL_KEY_BYTES:
            raise InvalidArgument(f"{field} key {quoted(key)} is {len(kb)} bytes; it must be 1-{MAX_LABEL_KEY_BYTES}")
        if len(vb) > MAX_LABEL_VALUE_BYTES:
            raise InvalidArgument(
                f"{field}[{quoted(key)}] value is {len(vb)} bytes; the limit is {MAX_LABEL_VALUE_BYTES}"
            )
        if has_control(key):
            raise InvalidArgument(f"{field} key {quoted(key)} {HAS_CONTROL}")
        if has_control(value):
            raise InvalidArgument(f"{field}[{quoted(key)}] value {quoted(value)} {HAS_CONTROL}")


def check_event_type(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{field} must be a string, not {type(value).__name__}")
    try:
        raw = value.encode()
    except UnicodeEncodeError:
        raise InvalidArgument(f"{field} {quoted(value)} {NOT_UTF8}") from None
    if not 1 <= len(raw) <= MAX_EVENT_TYPE_BYTES:
        raise InvalidArgument(f"{field} is {len(raw)} bytes; it must be 1-{MAX_EVENT_TYPE_BYTES} bytes of UTF-8")
    if has_control(value):
        raise InvalidArgument(f"{field} {quoted(value)} {HAS_CONTROL}")
    return value
