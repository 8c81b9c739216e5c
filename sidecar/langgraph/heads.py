"""What a saver knows of a namespace's head, the error a put that continued a head another writer moved
raises, and how a put continuing a checkpoint whose own put went unanswered finds the head it continues."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TypeVar

from ckpt.langgraph.v1 import records_pb2

from .calls import HEAD_MASK, Call, Op
from .records import Lists, Where, decode_step

K = TypeVar("K")
V = TypeVar("V")

#: What a put reads of the head before it starts a branch: its ids and where its pending writes begin.
BRANCH_MASK = (*HEAD_MASK, "writes_after_seq")
#: List elements cut off (a message removed, say) a namespace's state may keep before a rewrite drops them.
_DEAD_ELEMENTS_ALLOWED = 256


class CheckpointConflictError(RuntimeError):
    """Another writer moved a thread's head since this saver read it: the put that continued the old head
    wrote nothing. Re-run the graph on the thread (``invoke`` with the thread's config and no
    checkpoint_id) to continue from the new head."""

    def __init__(self, where: Where, parent_id: str | None, current_version: int) -> None:
        super().__init__(
            f"thread {where.thread_id!r} (checkpoint_ns {where.checkpoint_ns!r}) moved on: this saver continued"
            f" checkpoint {parent_id!r}, but another writer put a checkpoint after it (the namespace is now at"
            f" version {current_version}); nothing was written. Re-run the graph on the thread to continue from"
            " the new head."
        )
        self.thread_id = where.thread_id
        self.checkpoint_ns = where.checkpoint_ns
        self.parent_checkpoint_id = parent_id
        self.current_version = current_version


@dataclass(frozen=True, slots=True)
class Head:
    """A namespace's head as a saver last saw it: its checkpoint (None: no checkpoint yet) and version."""

    checkpoint_id: str | None
    version: int
    deleted: tuple[str, ...] = ()
    #: Its list channels' element digests (empty when unknown: a continuing step then sends lists whole).
    lists: Lists = field(default_factory=dict)
    #: List elements its stored state holds, cut-off ones included.
    stored_elements: int = 0
    #: Its Step's writes_after_seq (None: not known): a read of the head asks for its pending writes with it.
    writes_after_seq: int | None = None
    #: Its state's XXH3-64 (0: unknown), which a put continuing it expects: its version alone may be another's.
    state_xxh3: int = 0

    @property
    def needs_rewrite(self) -> bool:
        """Whether cut-off list elements outweigh live ones: the next step is written whole, dropping them."""
        live = sum(len(v) for v in self.lists.values())
        return self.stored_elements - live > max(_DEAD_ELEMENTS_ALLOWED, live)


def head_read(version: int, step: records_pb2.Step, state_xxh3: int) -> Head:
    """The head a read of its ids (HEAD_MASK) gives: its list digests unknown, so a step continuing it sends
    its lists whole."""
    deleted = tuple(step.deleted_checkpoint_ids)
    return Head(step.checkpoint_id, version, deleted, writes_after_seq=step.writes_after_seq, state_xxh3=state_xxh3)


def after_unanswered(where: Where, parent_id: str, before: Head) -> Op:
    """The head a put continuing ``parent_id`` continues, where ``parent_id`` is the checkpoint of this saver's
    put after ``before`` whose call ended unanswered (cancelled, or the sidecar gone): stored or not, only a
    read tells. Its head if it was stored and is still the head; ``before`` if it was not stored and nothing
    was put since (the put then starts a branch, as a put after an absent checkpoint does); otherwise another
    writer put after one of them, and continuing either would hide that write: CheckpointConflictError."""
    now = yield Call("get", (where.session_id, 0, BRANCH_MASK))
    if now is None:
        if before.version == 0:
            return before
        raise CheckpointConflictError(where, parent_id, 0)
    step = decode_step(now[1])
    if step.checkpoint_id == parent_id:
        return head_read(now[0], step, now[2])
    if (step.checkpoint_id, now[0]) == (before.checkpoint_id, before.version):
        return before
    raise CheckpointConflictError(where, parent_id, now[0])


def keep(table: OrderedDict[K, V], key: K, value: V, most: int) -> None:
    """``table[key] = value``, as its newest entry; its oldest dropped past ``most`` entries."""
    table[key] = value
    table.move_to_end(key)
    while len(table) > most:
        table.popitem(last=False)
