"""A state built from the outputs of a chain's streams, joined once at the end.

Every stream of a chain that starts after the first (a segment, FORMAT.md §14, or a PATCH after a resume)
extends the state before it, or its first bytes. Concatenating at each stream would copy the whole state
once per stream: a 150 MB state read through a dozen segments, 1.8 GB of copies. The pieces are kept
instead, cut back to a segment's base and joined once.
"""

from __future__ import annotations


class StatePieces:
    """The state so far, as pieces (bytes objects, never changed once added)."""

    __slots__ = ("_parts", "size")

    def __init__(self, start: bytes = b"") -> None:
        self._parts = [start] if start else []
        #: Bytes of the state so far.
        self.size = len(start)

    def replace(self, state: bytes) -> None:
        """The state is ``state`` (a whole state: a FULL or DELTA frame's)."""
        self._parts = [state] if state else []
        self.size = len(state)

    def cut(self, size: int) -> None:
        """Keep the first ``size`` bytes (at most :attr:`size`)."""
        parts, total = self._parts, self.size
        while parts and total - len(parts[-1]) >= size:
            total -= len(parts.pop())
        if total > size:
            last = parts[-1]
            parts[-1] = last[: len(last) - (total - size)]
        self.size = size

    def tail(self, count: int) -> bytes:
        """The last ``count`` bytes (at most :attr:`size`)."""
        out: list[bytes] = []
        need = count
        for part in reversed(self._parts):
            if need <= 0:
                break
            out.append(part if len(part) <= need else part[len(part) - need :])
            need -= len(part)
        out.reverse()
        return out[0] if len(out) == 1 else b"".join(out)

    def add(self, out: bytes) -> None:
        """Append ``out``."""
        if out:
            self._parts.append(out)
            self.size += len(out)

    def join(self) -> bytes:
        parts = self._parts
        if len(parts) != 1:
            self._parts = parts = [b"".join(parts)]
        return parts[0] if parts else b""
