"""An LMDB data file's pages: a table's branch and leaf pages found and damaged byte by byte (LMDB 0.9, 64-bit)."""

from __future__ import annotations

import struct
from pathlib import Path

import lmdb

# LMDB page layout: a 16-byte header (pgno u64, pad u16, flags u16, lower u16, upper u16), then
# u16 offsets of the nodes; a node is lo u16, hi u16, flags u16, key size u16, key, data.
HEADER = 16
P_BRANCH, P_LEAF = 0x01, 0x02
# LMDB's assertions, as it prints them (the line numbers are the bundled mdb.c's).
IS_LEAF = r"mdb\.c:\d+: Assertion 'IS_LEAF\(mp\)' failed in mdb_cursor_next\(\)"
NUMKEYS = r"mdb\.c:\d+: Assertion '!mc->mc_dbi \|\| NUMKEYS\(mp\) > 1' failed in mdb_page_search_root\(\)"


class Pages:
    """data.mdb's pages, to find and damage a table's branch and leaf pages."""

    def __init__(self, data: Path) -> None:
        self.path = data / "lmdb" / "data.mdb"
        env = lmdb.open(str(data / "lmdb"), max_dbs=8, readonly=True, lock=False)
        with env.begin() as txn:
            self.records = {name: txn.get(name.encode()) for name in ("frames", "sessions")}
        self.psize = env.stat()["psize"]
        env.close()
        self.buf = bytearray(self.path.read_bytes())

    def root(self, table: str) -> int:
        return int(struct.unpack_from("<Q", self.records[table] or b"", 40)[0])  # md_root of its MDB_db record

    def flags(self, pgno: int) -> int:
        return int(struct.unpack_from("<H", self.buf, pgno * self.psize + 10)[0])

    def nodes(self, pgno: int) -> list[tuple[int, int, bytes]]:
        """(offset of the node in its page, child page number for a branch, key) for each node."""
        base = pgno * self.psize
        lower = struct.unpack_from("<H", self.buf, base + 12)[0]
        out = []
        for i in range((lower - HEADER) // 2):
            offset = struct.unpack_from("<H", self.buf, base + HEADER + 2 * i)[0]
            lo, hi, flags, ksize = struct.unpack_from("<HHHH", self.buf, base + offset)
            key = bytes(self.buf[base + offset + 8 : base + offset + 8 + ksize])
            out.append((offset, lo | hi << 16 | flags << 32, key))
        return out

    def leaves(self, table: str) -> list[tuple[int, list[bytes]]]:
        """The table's leaf pages in key order, with their keys (the root must be a branch over leaves)."""
        root = self.root(table)
        assert self.flags(root) & P_BRANCH, f"{table}: the root is not a branch"
        out = []
        for _, child, _ in self.nodes(root):
            assert self.flags(child) & P_LEAF, f"{table}: more than two levels"
            out.append((child, [key for _, _, key in self.nodes(child)]))
        assert len(out) >= 3, f"{table} has {len(out)} leaves"
        return out

    def put(self, pgno: int, offset: int, fmt: str, value: int) -> None:
        struct.pack_into(fmt, self.buf, pgno * self.psize + offset, value)

    def write(self) -> None:
        self.path.write_bytes(self.buf)
