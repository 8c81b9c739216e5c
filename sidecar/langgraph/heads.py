"""What a saver knows of a namespace's head, and the error a put that continued a head another writer moved
raises."""

from __future__ import annotations

from dataclasses import dataclass, field

from ckpt.langgraph.v1 import records_pb2

from .records import Lists, Where

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
