"""What the savers' operations (operations.py, prune.py) yield to their drivers (savers.py), and the
constants of the calls they make."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from langgraph.checkpoint.base import CheckpointTuple

#: What a read of the head's ids asks for: enough to continue it or to rewrite it.
HEAD_MASK = ("checkpoint_id", "deleted_checkpoint_ids")
#: Events one AppendEvents carries at most (service.proto).
MAX_EVENTS = 1000


@dataclass(frozen=True, slots=True)
class Call:
    """A backend method to call and its arguments."""

    method: str
    args: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Out:
    """An item ``list`` gives its caller."""

    item: CheckpointTuple


Op = Generator[Call | Out, Any, Any]
