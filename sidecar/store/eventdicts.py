"""The store's event dictionary: a zstd dictionary trained once on the store's own first events.

A block's events compress against each other, but a session's first
events have nothing before them: the JSON keys, the types, the tool names
each session repeats are paid for again in every session's first block,
and most sessions' logs are one or two blocks. So once a store has seen
TRAIN_SAMPLE_BYTES of events, the writer trains a DICTIONARY_BYTES zstd
dictionary on them and stores it in the ``meta`` table (EVENT_DICTIONARY_KEY,
written once, never replaced or removed); each block compressed from then
on (a new block, an open block compressed again in one piece, a sealed
one) starts from it: on the trajectory corpus ~28% fewer bytes of blocks an event.

A dictionary is named by its zstd dictionary id, which this module derives
from its content (dictionary_id), and a frame compressed with it says that
id in its header: so a frame is decompressed with the dictionary it names,
found in a process-wide registry filled from every open store's meta table,
and two stores in one process never mix theirs. A store that has not
trained one reads and writes as before.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import xxhash

from ckpt.store.v1 import records_pb2

from ...codec.zstdlib import zstd
from ..errors import DataLoss
from ..storage import ReadTxn, Table, WriteTxn

#: A read transaction's opener (the store's).
ReadTxns = Callable[[], AbstractContextManager[ReadTxn]]

#: The meta table's key of the store's event dictionary.
EVENT_DICTIONARY_KEY = b"event_dictionary"
#: The dictionary's size: on the trajectory corpus 32 KiB gave the fewest bytes an event (8 KiB 14% more,
#: 64 KiB 12% more: a larger one fits its samples' particulars).
DICTIONARY_BYTES = 32 * 1024
#: Events sampled before training (~0.1 s of the writer's time, once in a store's life).
TRAIN_SAMPLE_BYTES = 512 * 1024
#: An event longer than this is sampled by its first bytes: what a dictionary learns is what events
#: begin with and repeat, and a logged file would have the trainer work through all of it.
SAMPLE_MAX_BYTES = 8 * 1024
#: Fewer samples than this and zstd's trainer has too little to go on: the writer samples on.
TRAIN_MIN_SAMPLES = 64
# zstd reserves dictionary ids below 32768 and from 2**31 for registered dictionaries.
_ID_LOW = 32768
_ID_SPAN = 2**31 - _ID_LOW
_MAGIC = b"\x37\xa4\x30\xec"


def dictionary_id(content: bytes) -> int:
    """The id a dictionary of ``content`` is stored under: its XXH3-64 (bytes 8 on) in zstd's user range."""
    return _ID_LOW + xxhash.xxh3_64_intdigest(content[8:]) % _ID_SPAN


def train(samples: Sequence[bytes]) -> bytes:
    """A dictionary trained on ``samples``, its id set to :func:`dictionary_id` of its content."""
    content = bytearray(zstd.train_dict(samples, DICTIONARY_BYTES).dict_content)
    content[4:8] = dictionary_id(bytes(content)).to_bytes(4, "little")
    return bytes(content)


class _Registry:
    """Every dictionary this process has read or trained, by id; and how to read more (each open store's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[int, zstd.ZstdDict] = {}
        self._sources: list[weakref.WeakMethod[Callable[[], bytes | None]]] = []

    def add(self, content: bytes) -> zstd.ZstdDict:
        """The dictionary of ``content`` (stored content: checked to be one, its id its content's)."""
        if len(content) < 8 or content[:4] != _MAGIC:
            raise DataLoss(f"the store's event dictionary ({len(content)} bytes) is not a zstd dictionary")
        found = int.from_bytes(content[4:8], "little")
        if found != dictionary_id(content):
            raise DataLoss(f"the store's event dictionary {found} fails its check (damaged on disk)")
        with self._lock:
            known = self._known.get(found)
            if known is None:
                known = self._known[found] = zstd.ZstdDict(content)
            return known

    def watch(self, read: Callable[[], bytes | None]) -> None:
        """Have :meth:`get` call ``read`` (a bound method: a store's stored dictionary, or None) for an id
        it does not know, while its object lives."""
        with self._lock:
            self._sources.append(weakref.WeakMethod(read))

    def get(self, dict_id: int, where: object) -> zstd.ZstdDict:
        """The dictionary of ``dict_id``, read from the open stores if not yet known; DataLoss naming
        ``where`` if none holds it."""
        known = self._known.get(dict_id)
        if known is not None:
            return known
        with self._lock:
            self._sources = [source for source in self._sources if source() is not None]
            sources = [source() for source in self._sources]
        damage = ""
        for read in sources:
            if read is None:
                continue
            try:
                content = read()
            except DataLoss:  # the store's own pages are damaged: said as the storage says it
                raise
            except Exception:  # a store closed since (its transactions refused): it holds nothing to read
                continue
            if content is not None:
                try:
                    self.add(content)
                except DataLoss as exc:
                    damage = f" ({exc})"
        known = self._known.get(dict_id)
        if known is None:
            raise DataLoss(
                f"{where}: the event block is compressed with dictionary {dict_id}, which the store does not"
                f" hold{damage}"
            )
        return known


#: The process's dictionaries.
REGISTRY = _Registry()


class StoreDictionary:
    """One store's event dictionary: read from its meta table, and trained by the writer's appends until it
    has one (the writer thread's alone, but for :meth:`stored`)."""

    def __init__(self, meta: Table | None, read: ReadTxns) -> None:
        #: The meta table (None: a read-only store without one, or without event tables: never a dictionary).
        self._meta = meta
        self._read = read
        #: Events sampled to train it: None once it has one, or once this process trained one (whether or
        #: not its transaction committed: the next open samples again).
        self._samples: list[bytes] | None = None
        self._sampled_bytes = 0
        #: The dictionary last read from the meta table: its content and its zstd form.
        self._last: tuple[bytes, zstd.ZstdDict] | None = None
        REGISTRY.watch(self.stored)
        if meta is not None and self.stored() is None:
            self._samples = []

    def stored(self) -> bytes | None:
        """The dictionary as stored (None: none yet), read in a transaction of its own."""
        if self._meta is None:
            return None
        with self._read() as txn:
            found = txn.get(EVENT_DICTIONARY_KEY, db=self._meta)
            return bytes(found) if found is not None else None

    def in_txn(self, txn: ReadTxn) -> zstd.ZstdDict | None:
        """The dictionary as ``txn`` sees it (None: none yet)."""
        if self._meta is None:
            return None
        found = txn.get(EVENT_DICTIONARY_KEY, db=self._meta)
        if found is None:
            return None
        if self._last is None or self._last[0] != found:
            content = bytes(found)
            self._last = (content, REGISTRY.add(content))
        return self._last[1]

    def for_append(self, txn: WriteTxn, new: Sequence[records_pb2.StoredEvent]) -> zstd.ZstdDict | None:
        """The dictionary the blocks of an append of ``new`` start from (None: none yet). Until the store
        has one, ``new`` is kept as samples; once there are enough, it is trained and stored in ``txn``,
        unless another process stored one first."""
        samples = self._samples
        if samples is not None:
            for event in new:
                sample = event.SerializeToString()[:SAMPLE_MAX_BYTES]
                samples.append(sample)
                self._sampled_bytes += len(sample)
            if self._sampled_bytes >= TRAIN_SAMPLE_BYTES and len(samples) >= TRAIN_MIN_SAMPLES:
                self._samples = None
                assert self._meta is not None
                if txn.get(EVENT_DICTIONARY_KEY, db=self._meta) is None:
                    # Samples zstd cannot train on (all alike): no dictionary, until the next open samples again.
                    with contextlib.suppress(zstd.ZstdError):
                        txn.put(EVENT_DICTIONARY_KEY, train(samples), db=self._meta)
        return self.in_txn(txn)
