"""A blob of pseudo-random bytes made as it is read, never whole in memory: the blob benchmark's data.

Python's own generators make 0.2-0.4 GB/s on our VMs (``random.randbytes``,
``os.urandom``), slower than a sidecar takes a blob: drawing every byte as it
is sent would bound both legs of the benchmark alike and hide what the
sidecar costs. So a blob is cut from a ring of up to RING_BLOCKS blocks drawn
once from ``random.Random(seed)``, each block of the blob stamped with
``(seed, its index)`` in its first 16 bytes: no two blocks of a blob are the
same, blobs of two seeds share no block (so deduplication cannot answer an
upload), the SHA-256 is real work, and making a block is one copy. A repeat
is a ring (32 MiB) apart, beyond the window of any compressor short of a
long-distance mode; the sidecar compresses no blob in any case.
"""

from __future__ import annotations

import hashlib
import random
import struct
import time
from collections.abc import Iterator

#: Bytes per block: the clients' PutBlob chunk (sidecar/client/blobs.py), so a read is a block.
BLOCK_BYTES = 1024 * 1024
#: Blocks drawn from the generator; the blob goes round them.
RING_BLOCKS = 32

_STAMP = struct.Struct("<QQ")


class SeededBlob:
    """``size_bytes`` pseudo-random bytes, the same for the same ``seed``, made block by block."""

    def __init__(self, seed: int, size_bytes: int, *, block_bytes: int = BLOCK_BYTES) -> None:
        if size_bytes < 0:
            raise ValueError(f"size_bytes must be >= 0, got {size_bytes}")
        if block_bytes <= _STAMP.size:
            raise ValueError(f"block_bytes must be > {_STAMP.size} (the stamp), got {block_bytes}")
        self.seed = seed
        self.size_bytes = size_bytes
        self.block_bytes = block_bytes
        rng = random.Random(seed)
        ring = min(RING_BLOCKS, max(1, -(-size_bytes // block_bytes)))
        self._ring = [rng.randbytes(block_bytes - _STAMP.size) for _ in range(ring)]

    def blocks(self) -> Iterator[bytes]:
        """The blob from its start, ``block_bytes`` at a time (the last may be shorter)."""
        whole, rest = divmod(self.size_bytes, self.block_bytes)
        for i in range(whole):
            yield _STAMP.pack(self.seed, i) + self._ring[i % len(self._ring)]
        if rest:
            yield (_STAMP.pack(self.seed, whole) + self._ring[whole % len(self._ring)])[:rest]

    def reader(self) -> BlobReader:
        """The blob from its start, as a binary file to read (what ``put_blob`` takes)."""
        return BlobReader(self.blocks())

    def sha256(self) -> str:
        """The blob's SHA-256 (hex), computed here block by block: what the sidecar must answer."""
        digest = hashlib.sha256()
        for block in self.blocks():
            digest.update(block)
        return digest.hexdigest()


class BlobReader:
    """``read(n)`` over a stream of blocks: a read of a whole block hands it over without a copy."""

    def __init__(self, blocks: Iterator[bytes]) -> None:
        self._blocks = blocks
        self._pending = b""
        #: time.perf_counter() when a read found the blocks at their end: the last byte was handed over.
        self.ended_at: float | None = None

    def read(self, size: int = -1) -> bytes:
        if size < 0:
            raise ValueError("read the blob in pieces (a size >= 0): it is never held whole")
        parts: list[bytes] = []
        need = size
        while need:
            if not self._pending:
                block = next(self._blocks, None)
                if block is None:
                    if self.ended_at is None:
                        self.ended_at = time.perf_counter()
                    break
                self._pending = block
            if len(self._pending) <= need:
                parts.append(self._pending)
                need -= len(self._pending)
                self._pending = b""
            else:
                parts.append(self._pending[:need])
                self._pending = self._pending[need:]
                need = 0
        return parts[0] if len(parts) == 1 else b"".join(parts)
