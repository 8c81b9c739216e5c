"""The tables' key layout (docs/storage.md); ids and labels are checked by sidecar/ids.py's rules (named here too).

Tables (the storage seam's named tables; LMDB databases today):

    frames      session \\0 version(u64 BE)            -> u16 LE len + VersionRecord + frame
    sessions    session                               -> SessionRecord
    requests    \\2 H8(session) H8(session \\0 request_id) -> RequestRecord
                (layouts 2-4: \\1 request_id \\0 session; layout 1: session \\0 request_id; both still read)
    req_expiry  expires_ns(u64 BE) + its requests key  -> b""
    labels      key \\0 value \\0 session                -> b""
    updated     updated_ns(u64 BE) session            -> b""
    blobs       sha256 (32 bytes)                     -> BlobRecord (blobs.py; bytes: blobfiles.py)
    blob_refs   session \\0 sha256                     -> BlobRefRecord

Session ids cannot contain NUL (or any control character), so ``session \\0``
is a prefix no other session shares, and big-endian versions sort
numerically: one session's frames are one contiguous, ordered key range.

A request id's record is keyed by two 8-byte BLAKE2b hashes (17 bytes with
its mark): of the session id, then of the session id and the request id. The
key is a fixed 17 bytes whatever the ids' lengths (layouts 2-4 keyed it by
both ids, 40-300 bytes, and the req_expiry index repeats the key), and a
client cannot craft one that collides with another session's request: a
hash that is not cryptographic could be. The session's hash first makes a
session's records one key range, so `ckpt verify` finds them by a seek per
session (the records outlive a deleted session; nothing else looks them up by
session). The price: a commit's records land on pages spread over the table,
where layouts 2-4 kept time-ordered request ids (UUIDv7) side by side.

Neither id may hold a control character, so the leading byte tells the three
forms apart: \\1 (layouts 2-4), \\2 (this one), and layout 1's keys sort
after both (no session id starts with a control character).
"""

from __future__ import annotations

import struct
from hashlib import blake2b

from ..errors import InvalidArgument
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
from ..ids import session_key as session_key

_U64 = struct.Struct(">Q")
SEP = b"\x00"


#: The first byte of every current request key (see the module's docstring).
REQUEST_KEY_MARK = b"\x02"
#: A current request key's length: the mark, the session's hash, the request's hash.
REQUEST_KEY_BYTES = 17
_HASH_BYTES = 8
#: The first byte of a request key of store layouts 2-4 (request id NUL session id).
LAYOUT4_REQUEST_KEY_MARK = b"\x01"
#: Every layout-1 request key sorts at or after this, and no other one does (a session id's first byte
#: is not a control character).
LAYOUT1_REQUEST_KEYS_START = b"\x03"


def request_id_bytes(request_id: str) -> bytes:
    """A request id's bytes, checked: the store keeps none longer than MAX_REQUEST_ID_BYTES, nor one with
    a control character (layouts 1-4 keyed their records by it, and a retry's lookup still builds those keys)."""
    raw = request_id.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_REQUEST_ID_BYTES:
        raise InvalidArgument(f"request_id is {len(raw)} bytes; the limit is {MAX_REQUEST_ID_BYTES}")
    if has_control(request_id):
        raise InvalidArgument(f"request_id {request_id!r} {HAS_CONTROL}")
    return raw


def session_requests_prefix(sid: bytes) -> bytes:
    """The key range of a session's request records: the mark and the session id's hash."""
    return REQUEST_KEY_MARK + blake2b(sid, digest_size=_HASH_BYTES).digest()


def request_key(sid: bytes, request_id: str) -> bytes:
    """The requests table's key of a session's request id (validated)."""
    raw = request_id_bytes(request_id)
    return session_requests_prefix(sid) + blake2b(sid + SEP + raw, digest_size=_HASH_BYTES).digest()


def layout4_request_key(sid: bytes, request_id: str) -> bytes:
    """The key store layouts 2-4 gave the same request (``request_id`` checked by :func:`request_key`)."""
    return LAYOUT4_REQUEST_KEY_MARK + request_id.encode("utf-8", "surrogatepass") + SEP + sid


def layout1_request_key(sid: bytes, request_id: str) -> bytes:
    """The key store layout 1 gave the same request."""
    return sid + SEP + request_id.encode("utf-8", "surrogatepass")


def request_key_parts(key: bytes) -> tuple[bytes, bytes] | None:
    """(session id, request id) of a requests key of layouts 1-4; None if it is neither (a current key
    names neither id)."""
    if key.startswith(LAYOUT4_REQUEST_KEY_MARK):
        raw, sep, sid = key[1:].partition(SEP)
    elif key[:1] >= LAYOUT1_REQUEST_KEYS_START:
        sid, sep, raw = key.partition(SEP)
    else:
        return None
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
