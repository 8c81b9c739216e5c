"""`ckpt verify`'s check of the meta table: each key the store reads, as the store writes it.

A value the store cannot read fails writes (types_generation, types_field_history: every typed write is
DataLoss), a writable open (layout_version), or is taken as 0 (last_write_unix_nanos: write times could then
go back, and a retry after a delete be answered by the deleted session's record; the sweep's and the quiet
keyframes' and folds' times: their work done again). Every number is written as ASCII digits. Other keys are not
checked (a store keeps none).
"""

from __future__ import annotations

from collections.abc import Iterator

from google.protobuf.message import DecodeError as DecodeProtoError

from ckpt.store.v1 import records_pb2

from ..storage import ReadTxn
from ..store.layout import (
    FIELD_HISTORY_KEY,
    FOLDED_BEFORE_KEY,
    KEYFRAMED_BEFORE_KEY,
    LAST_SWEEP_KEY,
    LAYOUT_KEY,
    LAYOUT_VERSION,
    TYPES_GENERATION_KEY,
    WRITE_TIME_KEY,
    Tables,
)

#: The numbers the meta table may hold, and what a value that is not one breaks.
_NUMBERS = {
    LAYOUT_KEY: "the store cannot be opened writable",
    TYPES_GENERATION_KEY: "typed writes and registrations fail (DataLoss)",
    WRITE_TIME_KEY: "it is taken as 0, so write times may go back",
    LAST_SWEEP_KEY: "it is taken as 0: the sweep schedule restarts",
    KEYFRAMED_BEFORE_KEY: "it is taken as 0: the quiet-keyframe sweep reads the whole updated-time index",
    FOLDED_BEFORE_KEY: "it is taken as 0: the fold sweep reads the whole updated-time index",
}


def meta_problems(txn: ReadTxn, tables: Tables) -> Iterator[str]:
    """What is wrong with the meta table's keys, each naming the key and its value (none: no meta table)."""
    meta = tables.meta
    if meta is None:  # a read-only store never stamped (layout 1): nothing to check
        return
    for key, harm in _NUMBERS.items():
        raw = txn.get(key, db=meta)
        if raw is None:
            continue
        value = bytes(raw)
        name = key.decode()
        if not value.isdigit():
            yield f"{name} {value!r} is not a number: {harm}"
        elif key == LAYOUT_KEY and not 1 <= int(value) <= LAYOUT_VERSION:
            yield f"{name} {value!r} is not a store layout (1-{LAYOUT_VERSION}): {harm}"
    raw = txn.get(FIELD_HISTORY_KEY, db=meta)
    if raw is not None:
        try:
            records_pb2.FieldHistory.FromString(bytes(raw))
        except DecodeProtoError as exc:
            yield (
                f"{FIELD_HISTORY_KEY.decode()} ({len(raw)} bytes) does not parse as a FieldHistory ({exc}):"
                " registrations fail (DataLoss)"
            )
