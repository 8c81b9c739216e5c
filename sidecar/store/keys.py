"""The tables' key layout (docs/storage.md); ids and labels are checked by sidecar/ids.py's rules (named here too).

Tables (the storage seam's named tables; LMDB databases today):

    frames      session \\0 version(u64 BE)            -> u16 LE len + VersionRecord + frame
    sessions    session                               -> SessionRecord
    requests    \\1 request_id \\0 session            -> RequestRecord
                (store layout 1: session \\0 request_id; still read)
    req_expiry  expires_ns(u64 BE) + its requests key  -> b""
    labels      key \\0 value \\0 session                -> b""
    updated     updated_ns(u64 BE) session            -> b""
    blobs       sha256 (32 bytes)                     -> BlobRecord (blobs.py; bytes: blobfiles.py)
    blob_refs   session \\0 sha256                     -> BlobRefRecord

Session ids cannot contain NUL (or any control character), so ``session \\0``
is a prefix no other session shares, and big-endian versions sort
numerically: one session's frames are one contiguous, ordered key range.

A request id's record is keyed by the request id first. The clients generate
time-ordered ids (UUIDv7), so a commit's records land side by side after the ones
before them: a page or two for the whole commit. Keyed by session first (store
layout 1), each session's records were a key range of their own, and each
write dirtied a page of its session's range: about one more 4 KB page written
per write. Neither id may hold a control character, so the leading \\1 tells
the two key forms apart (no session id starts with it) and sorts every
current key before every layout-1 one.
"""

from __future__ import annotations

import struct

from ..ids import HAS_CONTROL as HAS_CONTROL
from ..ids import MAX_LABEL_KEY_BYTES as MAX_LABEL_KEY_BYTES
from ..ids import MAX_LABEL_VALUE_BYTES as MAX_LABEL_VALUE_BYTES
from ..ids import MAX_LABELS as MAX_LABELS
from ..ids import MAX_REQUEST_ID_BYTES as MAX_REQUEST_ID_BYTES
from ..ids import MAX_SESSION_ID_BYTES as MAX_SESSION_ID_BYTES
from ..ids import QUOTED_CHARS as QUOTED_CHARS
from ..ids import check_labels as check_labels
from ..ids import has_control as has_control
from ..ids import quoted as quoted
from ..ids import request_id_bytes
from ..ids import session_key as session_key

_U64 = struct.Struct(">Q")
SEP = b"\x00"


#: The first byte of every current request key (see the module's docstring).
REQUEST_KEY_MARK = b"\x01"
#: No current request key sorts at or after this, and every layout-1 one does (a session id's
#: first byte is not a control character).
LAYOUT1_REQUEST_KEYS_START = b"\x02"


def request_key(sid: bytes, request_id: str) -> bytes:
    """The requests table's key of a session's request id (validated)."""
    return REQUEST_KEY_MARK + request_id_bytes(request_id) + SEP + sid


def layout1_request_key(key: bytes) -> bytes:
    """The key store layout 1 gave the same request (``key`` from :func:`request_key`)."""
    raw, _, sid = key[1:].partition(SEP)
    return sid + SEP + raw


def request_key_parts(key: bytes) -> tuple[bytes, bytes] | None:
    """(session id, request id) of a requests key of either form; None if it is neither."""
    if key.startswith(REQUEST_KEY_MARK):
        raw, sep, sid = key[1:].partition(SEP)
    else:
        sid, sep, raw = key.partition(SEP)
    if not sep or not sid or not raw:
        return None
    return sid, raw


def frame_key(sid: bytes, version: int) -> bytes:
    return sid + SEP + _U64.pack(version)


def frame_version(key: bytes, sid: bytes) -> int:
    return int(_U64.unpack_from(key, len(sid) + 1)[0])


def label_key(key: str, value: str, sid: bytes) -> bytes:
    return key.encode() + SEP + value.encode() + SEP + sid


def label_prefix(key: str, value: str) -> bytes:
    return key.encode() + SEP + value.encode() + SEP


#: The updated-time index records each session under its update time rounded
#: down to this many nanoseconds (2**30, about 1.07 s). A session writing many
#: versions a second (an agent's burst) moves its index entry once a second,
#: not on every write; listings check the exact time in the session record.
UPDATED_INDEX_GRANULE_NANOS = 1 << 30


def updated_granule(nanos: int) -> int:
    """The time the updated-time index keys ``nanos`` under (rounded down to the granule)."""
    return max(nanos, 0) & ~(UPDATED_INDEX_GRANULE_NANOS - 1)


def updated_key(nanos: int, sid: bytes) -> bytes:
    """Key of a session in the updated-time index (time rounded down to the granule)."""
    return time_key(updated_granule(nanos), sid)


def same_updated_granule(a: int, b: int) -> bool:
    """Whether two update times share one index key (no index move needed)."""
    return updated_granule(a) == updated_granule(b)


#: Times are keyed as unsigned 64-bit nanoseconds since the Unix epoch (to 2554).
MAX_TIME_NANOS = 2**64 - 1


def time_key(nanos: int, rest: bytes) -> bytes:
    return _U64.pack(max(nanos, 0)) + rest


def time_of(key: bytes) -> int:
    return int(_U64.unpack_from(key)[0])
