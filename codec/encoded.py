"""What an encoder hands out: a frame ready to store, and a version's state as the encoder held it."""

from __future__ import annotations

from dataclasses import dataclass

from .frame import FrameHeader, FrameKind


@dataclass(frozen=True, slots=True)
class EncodedFrame:
    """A frame ready to store: its header and its bytes (header + payload)."""

    header: FrameHeader
    data: bytes

    @property
    def kind(self) -> FrameKind:
        return self.header.kind

    @property
    def version(self) -> int:
        return self.header.version

    @property
    def stored_bytes(self) -> int:
        return len(self.data)


class StateSnapshot:
    """One version's state as its encoder held it, joined into bytes only when read.

    A MERGE appends a patch to the head state; copying the whole head out after
    every write would make an O(patch) write cost O(state). A snapshot instead
    keeps the encoder's list of chunks and how many of them make this version.
    The encoder only appends to such a list, or cuts it back after a frame
    that was not stored (never below a version it handed out), and starts a
    new list for a new state; so the chunks a snapshot covers never change, and
    it can be read from any thread while the encoder goes on.
    """

    __slots__ = ("_source", "size")

    def __init__(self, chunks: list[bytes], chunk_count: int, size: int) -> None:
        # One attribute, swapped for the joined bytes on first read: a reader
        # racing another sees either the chunks or the bytes, never half of each.
        self._source: tuple[list[bytes], int] | bytes = (chunks, chunk_count)
        #: Length of the state in bytes.
        self.size = size

    def __len__(self) -> int:
        return self.size

    def tobytes(self) -> bytes:
        """The state (joined once, then kept)."""
        source = self._source
        if isinstance(source, bytes):
            return source
        chunks, count = source
        joined = b"".join(chunks[:count])  # one chunk: the same object, no copy
        self._source = joined
        return joined
