"""What every system shares: the ``System`` interface the runner drives, and the checks of what it read back."""

from __future__ import annotations

import abc
import os
import stat
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from ckpt.v1 import checkpoint_pb2

from ...trajectories import Step

MODES = ("merge", "replace")


def state_to_dict(state: bytes) -> dict[str, Any]:
    """A serialized ckpt.v1.Checkpoint as the JSON-compatible dict an app would hold (proto field names)."""
    msg = checkpoint_pb2.Checkpoint.FromString(state)
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


def same_checkpoint(got: bytes, state: bytes) -> bool:
    # A MERGE-written state is the concatenation of patches: the same message,
    # not the same bytes as the re-serialized step state.
    if got == state:
        return True
    return checkpoint_pb2.Checkpoint.FromString(got) == checkpoint_pb2.Checkpoint.FromString(state)


def dir_bytes(path: Path, *, exclude: frozenset[str] = frozenset()) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            if name in exclude:
                continue
            try:
                st = os.stat(os.path.join(root, name))
            except FileNotFoundError:  # e.g. a -shm file removed by a closing connection
                continue
            if stat.S_ISREG(st.st_mode):  # not unix sockets
                total += st.st_size
    return total


class System(abc.ABC):
    """One checkpoint store as an application uses it. See the module docstring for each system."""

    #: Stable id used in results JSON and the report (the key in SYSTEMS).
    name: str
    #: Human label for the report.
    label: str
    #: False for in-memory systems (no disk, no cold read after reopen).
    persistent: bool = True
    #: The durability setting in force, as found (filled in at open for SQLite-based systems).
    durability: str = ""

    @abc.abstractmethod
    def prepare(self, step: Step) -> Any:
        """UNTIMED: the value an application using this system holds after this step and hands to put."""

    @abc.abstractmethod
    def open(self, data_dir: Path) -> None:
        """Create or open the store under data_dir. May be called again after close(), on a new directory."""

    @abc.abstractmethod
    def put(self, session_id: str, version: int, value: Any) -> None:
        """TIMED: write version ``version`` (1, 2, ... per session); returns once durable. Thread-safe."""

    @abc.abstractmethod
    def get(self, session_id: str, version: int | None = None) -> Any:
        """TIMED: the stored value of ``version`` (None = latest). Thread-safe.

        Raises if absent: KeyError, or the ckpt systems' own NotFound / NotFoundError.
        """

    @abc.abstractmethod
    def matches(self, got: Any, step: Step) -> bool:
        """UNTIMED: does a value returned by get equal this step's state?"""

    @abc.abstractmethod
    def reopen(self) -> None:
        """Close and reopen from disk, dropping in-process caches (the next gets are cold)."""

    @abc.abstractmethod
    def close(self) -> None: ...

    @abc.abstractmethod
    def disk_bytes(self) -> int:
        """Bytes on disk under data_dir now (sum of file sizes; 0 for in-memory systems)."""

    def stored_bytes(self) -> int | None:
        """Logical bytes of stored checkpoint payloads, if the system can tell."""
        return None

    def server_cpu_seconds(self) -> float:
        """CPU seconds (user + sys) used so far by the system's server processes; 0.0 without any."""
        return 0.0
