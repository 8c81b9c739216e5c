"""Whether the pages past the end of an LMDB data file are all free, read from the file with plain reads.

LMDB never writes pages a transaction allocated and freed again, yet its
meta page counts them (``mm_last_pg``): after a commit, data.mdb can end
before its last page until the writer grows it
(:meth:`~.lmdb_storage.LmdbStorage.committed`), and a power cut in between
leaves it so. Such pages are on LMDB's free list (FREE_DBI, a B-tree of
txnid -> list of page numbers); a page past the end that is not on it is
one the database uses, so the file was cut. Deciding this must not read
the file through a map: a page past the end would be SIGBUS.

LMDB 0.9's format (py-lmdb bundles it), 64-bit build, native byte order:

- a page: pgno (8), pad (2), flags (2), then lower and upper (2 + 2), or
  an overflow run's page count (4); a B-tree page's node offsets follow
  (2 each), its nodes sit between ``upper`` and the page's end;
- a node: data size, or in a branch the child's page number (lo, hi: 2 + 2,
  flags: 2, the page number's high bits in a branch), key size (2), key,
  data; F_BIGDATA: the data (8) is the page number of its overflow run;
- a meta page (pages 0 and 1, the newer txnid wins): after the page
  header, magic (4), version (4), address (8), map size (8), two databases
  of 48 bytes (pad: for FREE_DBI the page size (4), flags (2), depth (2),
  four counts (8 each), root (8)), last page (8), txnid (8);
- a free-list record's data: a count, then that many page numbers (8 each).

Every offset, size and page number read is checked against the page, the
file and the last page, and no page is read twice: a damaged file gives
DataLoss, never an exception of another kind or a loop.
"""

from __future__ import annotations

import os
import struct
from array import array
from pathlib import Path

from ..errors import DataLoss

_HEADER = 16
_P_BRANCH, _P_LEAF, _P_OVERFLOW, _P_META, _P_LEAF2 = 0x01, 0x02, 0x04, 0x08, 0x20
_KINDS = _P_BRANCH | _P_LEAF | _P_OVERFLOW | _P_META | _P_LEAF2
_F_BIGDATA = 0x01
_MAGIC, _VERSION = 0xBEEFC0DE, 1
_NO_PAGE = 2**64 - 1  # an empty tree's root
_META_BYTES = _HEADER + 136
_PAGE_HEADER = struct.Struct("=QHHHH")  # pgno, pad, flags, lower, upper
_META = struct.Struct(f"={_HEADER}xII16xIHH32xQ48xQQ")  # magic, version, psize, flags, depth, root, last, txnid
_NODE = struct.Struct("=HHHH")  # lo, hi, flags, key size
_PGNO = struct.Struct("=Q")
# Opens that find the newest meta page replaced while they read the free list: a writer beside this
# process committed meanwhile, and may have reused the pages read. Each attempt starts over.
_ATTEMPTS = 20


class _Damaged(Exception):
    """What in the file cannot be read as LMDB's format (or is missing from it)."""


class _Missing(_Damaged):
    """A page of the free list itself is past the end of the file."""


class _Meta:
    __slots__ = ("depth", "last_pg", "page_bytes", "root", "txnid")

    def __init__(self, page_bytes: int, depth: int, root: int, last_pg: int, txnid: int) -> None:
        self.page_bytes, self.depth, self.root, self.last_pg, self.txnid = page_bytes, depth, root, last_pg, txnid


def unwritten_tail_bytes(data_mdb: Path) -> int:
    """The size data.mdb must have, once checked that every page it lacks is free (DataLoss if not).

    The newest meta page is read before the file's size: a commit writes its
    pages before its meta page, so any page that meta page's database uses
    and a writer beside this process wrote is in the file by then. Should
    the free list fail to read or leave a page out while the newest meta page
    changes under it, all is read again.
    """
    with data_mdb.open("rb") as f:
        fd = f.fileno()
        for attempt in range(1, _ATTEMPTS + 1):
            meta = _newest_meta(fd, data_mdb)
            size = os.fstat(fd).st_size
            needed = (meta.last_pg + 1) * meta.page_bytes
            if size >= needed:
                return needed
            try:
                used = _pages_not_free(fd, meta, size // meta.page_bytes)
                reason = f"{used} of the {meta.last_pg + 1 - size // meta.page_bytes} pages past its end are in use"
            except _Missing as exc:
                used, reason = -1, str(exc)
            except _Damaged as exc:
                used, reason = -1, f"its free-page list cannot be read: {exc}"
            if used == 0:
                return needed
            if attempt < _ATTEMPTS and _newest_meta(fd, data_mdb).txnid != meta.txnid:
                continue
            raise DataLoss(
                f"{data_mdb} is truncated: {size} bytes, but its database uses {needed} ({reason});"
                " nothing in it can be read safely (restore it from a copy)"
            )
    raise AssertionError("unreachable")


def _newest_meta(fd: int, data_mdb: Path) -> _Meta:
    metas = []
    offset = 0
    for _ in range(2):
        raw = os.pread(fd, _META_BYTES, offset)
        if len(raw) < _META_BYTES:
            break
        flags = _PAGE_HEADER.unpack_from(raw)[2]
        magic, version, page_bytes, _, depth, root, last_pg, txnid = _META.unpack_from(raw)
        if not flags & _P_META or magic != _MAGIC or version != _VERSION:
            break
        if page_bytes < 256 or page_bytes > 65536 or page_bytes & (page_bytes - 1) or last_pg < 1:
            break
        metas.append(_Meta(page_bytes, depth, root, last_pg, txnid))
        offset = page_bytes
    if len(metas) < 2:
        raise DataLoss(f"{data_mdb} cannot be opened as an LMDB database: a meta page is damaged or missing")
    return max(metas, key=lambda m: m.txnid)


def _pages_not_free(fd: int, meta: _Meta, first: int) -> int:
    """How many of pages first..meta.last_pg the free list of ``meta`` leaves out."""
    psize, last = meta.page_bytes, meta.last_pg
    free = bytearray(last + 1 - first)
    if meta.root == _NO_PAGE:
        return len(free)

    def read(pgno: int, pages: int, want: int) -> bytes:
        if pgno < 2 or pgno + pages - 1 > last:
            raise _Damaged(f"page {pgno} is out of range (the last page is {last})")
        raw = os.pread(fd, pages * psize, pgno * psize)
        if len(raw) < pages * psize:
            raise _Missing(f"page {pgno} of its free-page list is past its end")
        number, _, flags, _, _ = _PAGE_HEADER.unpack_from(raw)
        if number != pgno or flags & _KINDS != want:
            raise _Damaged(f"page {pgno} is not the page its tree names (pgno {number}, flags {flags:#x})")
        return raw

    def mark(value: bytes | memoryview) -> None:
        count = _PGNO.unpack_from(value)[0] if len(value) >= 8 else -1
        if count < 0 or (count + 1) * 8 > len(value):
            raise _Damaged(f"a free-list record of {len(value)} bytes holds {count} page numbers")
        ids = array("Q", bytes(value[8 : 8 + count * 8]))
        for pgno in ids:
            if pgno < 2 or pgno > last:
                raise _Damaged(f"the free list holds page {pgno} (the last page is {last})")
            if pgno >= first:
                free[pgno - first] = 1

    if not 1 <= meta.depth <= 64:
        raise _Damaged(f"the free list's depth is {meta.depth}")
    seen: set[int] = set()
    todo = [(meta.root, 1)]
    while todo:
        pgno, level = todo.pop()
        if pgno in seen:
            raise _Damaged(f"page {pgno} is reached twice")
        seen.add(pgno)
        page = read(pgno, 1, _P_LEAF if level == meta.depth else _P_BRANCH)
        lower, upper = _PAGE_HEADER.unpack_from(page)[3:]
        if lower < _HEADER or lower & 1 or upper < lower or upper > psize:
            raise _Damaged(f"page {pgno} has bounds {lower}..{upper}")
        for offset in struct.unpack_from(f"={(lower - _HEADER) // 2}H", page, _HEADER):
            if offset < upper or offset + _NODE.size > psize:
                raise _Damaged(f"page {pgno} has a node at offset {offset}")
            lo, hi, flags, key_bytes = _NODE.unpack_from(page, offset)
            start = offset + _NODE.size + key_bytes
            if level < meta.depth:
                todo.append((lo | hi << 16 | flags << 32, level + 1))
                continue
            size = lo | hi << 16
            if size > 8 * (last + 2):  # more page numbers than the file has pages
                raise _Damaged(f"page {pgno} has a free-list record of {size} bytes")
            if flags & _F_BIGDATA:
                if start + 8 > psize:
                    raise _Damaged(f"page {pgno} has a node past its end")
                run = _PGNO.unpack_from(page, start)[0]
                if run in seen:
                    raise _Damaged(f"page {run} is reached twice")
                seen.add(run)
                pages = -(-(_HEADER + size) // psize)
                mark(memoryview(read(run, pages, _P_OVERFLOW))[_HEADER : _HEADER + size])
            elif start + size > psize:
                raise _Damaged(f"page {pgno} has a node past its end")
            else:
                mark(memoryview(page)[start : start + size])
    return free.count(0)
