"""The tables' key layout (docs/storage.md); ids and labels are checked by sidecar/ids.py's rules (named here too).

Tables (the storage seam's named tables; LMDB databases today):

    frames      session \\0 version(u64 BE)            -> u16 LE len + VersionRecord + frame
    sessions    session                               -> SessionRecord
    requests    \\0 uuid(16 bytes) session            -> RequestRecord
                (a request id of 32 lowercase hex digits, as the clients make them)
                \\1 request_id \\0 session            -> RequestRecord
                (any other request id, and every one before store layout 6; still read)
                (store layout 1: session \\0 request_id; still read)
    req_expiry  expires_ns(u64 BE) + \\0 uuid          -> b"" (a compact key's entry: every
                session's record of that id expiring then)
                expires_ns(u64 BE) + its requests key  -> b"" (any other key's)
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

Request ids the clients generate are 32 lowercase hex digits (a UUIDv7):
store layout 6 keys those by their 16 bytes (``\\0``, the id's bytes, the
session id: 17 bytes and the session's, where the hex form took 34), and
their expiry entry names only ``\\0`` and the id's bytes (the sweeper looks
at every session's record of that id, and removes the ones expiring then).
The id's bytes are the id, so no two ids share a key; ``\\0`` sorts before
``\\1``, so the records of layout 2-5 keep their place. Records the hex form
keyed before layout 6 are still read under it (RequestIds.lookup).

A UUIDv7 begins with its time in ms, so the compact keys sort by the time
their ids were made. Store layout 8 gives a record of such an id no expiry
entry when the id is dated within ID_TIME_SLACK_NANOS of its write (as a
client's fresh id is): the sweeper walks the compact keys from the first and
removes those records once their ids are a TTL and the slack old
(RequestRecord.swept_by_id_time); an id dated further off keeps its entry.
"""

from __future__ import annotations

import re
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


#: The first byte of a request key of the other current form (see the module's docstring).
REQUEST_KEY_MARK = b"\x01"
#: The first byte of a compact request key: a request id of 32 lowercase hex digits, as bytes.
COMPACT_REQUEST_KEY_MARK = b"\x00"
#: A compact key's mark and id bytes: its expiry entry's part after the time.
COMPACT_PREFIX_BYTES = 17
_HEX_ID = re.compile(r"[0-9a-f]{32}")
#: No current request key sorts at or after this, and every layout-1 one does (a session id's
#: first byte is not a control character).
LAYOUT1_REQUEST_KEYS_START = b"\x02"


def request_key(sid: bytes, request_id: str) -> bytes:
    """The requests table's key of a session's request id (validated): compact for an id of 32 lowercase
    hex digits, else the id in full."""
    if len(request_id) == 32 and _HEX_ID.fullmatch(request_id):
        return COMPACT_REQUEST_KEY_MARK + bytes.fromhex(request_id) + sid
    return REQUEST_KEY_MARK + request_id_bytes(request_id) + SEP + sid


#: How far a UUIDv7's time may be from its write's for its record to go without an expiry entry; a record
#: so kept outlives its expiry by at most twice this (the sweep removes it by the id's time, not its own).
ID_TIME_SLACK_NANOS = 5 * 60 * 10**9


def uuid7_nanos(key: bytes) -> int | None:
    """The time (ns since the epoch, to the ms) a compact ``key``'s request id carries if the id is a UUIDv7
    (version nibble 7, variant 0b10: RFC 9562); None for any other key."""
    if len(key) < COMPACT_PREFIX_BYTES or key[0] != 0 or key[7] >> 4 != 7 or key[9] >> 6 != 2:
        return None
    return int.from_bytes(key[1:7], "big") * 1_000_000


def uuid7_key_before(nanos: int) -> bytes:
    """A compact key sorting before every UUIDv7 key whose time is at or after ``nanos`` (rounded down to
    the ms), and after every one before it."""
    return COMPACT_REQUEST_KEY_MARK + (max(nanos, 0) // 1_000_000 & (1 << 48) - 1).to_bytes(6, "big")


def is_compact(key: bytes) -> bool:
    """Whether a requests key is of the compact form (:func:`request_key`)."""
    return key.startswith(COMPACT_REQUEST_KEY_MARK)


def hex_request_key(key: bytes) -> bytes:
    """The key a compact ``key``'s request had before store layout 6 (the id in full, as hex)."""
    return REQUEST_KEY_MARK + key[1:COMPACT_PREFIX_BYTES].hex().encode() + SEP + key[COMPACT_PREFIX_BYTES:]


def expiry_key(expires: int, key: bytes) -> bytes:
    """The req_expiry entry of the record under requests ``key`` expiring at ``expires``."""
    return time_key(expires, key[:COMPACT_PREFIX_BYTES] if is_compact(key) else key)


def layout1_request_key(key: bytes) -> bytes:
    """The key store layout 1 gave the same request (``key`` from :func:`request_key`)."""
    raw, _, sid = key[1:].partition(SEP)
    return sid + SEP + raw


def request_key_parts(key: bytes) -> tuple[bytes, bytes] | None:
    """(session id, request id) of a requests key of any form; None if it is none."""
    if is_compact(key):
        if len(key) <= COMPACT_PREFIX_BYTES:
            return None
        return key[COMPACT_PREFIX_BYTES:], key[1:COMPACT_PREFIX_BYTES].hex().encode()
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
