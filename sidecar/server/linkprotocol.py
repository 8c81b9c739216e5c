"""What both ends of the link share: the asyncio protocol (frames in from a FrameReader, out through a
FrameWriter), and the largest frame either reads."""

from __future__ import annotations

import asyncio
import logging
from typing import cast

from .link import Frame, FrameReader, FrameWriter, LinkError

log = logging.getLogger(__name__)


def link_frame_bytes(max_message_bytes: int) -> int:
    """The largest frame either end reads: one gRPC message of either direction (at most
    ``--max-message-bytes``) plus its status; a larger one is taken for a broken link."""
    return max_message_bytes + 1024 * 1024


class LinkProtocol(asyncio.Protocol):
    """One end of the link; a subclass handles each frame that arrives, and bytes that are not frames."""

    #: Who sends what this end reads, for the log line about bytes that are not frames.
    peer = "the other end of the link"

    def __init__(self, *, max_frame_bytes: int) -> None:
        self.reader = FrameReader(max_frame_bytes=max_frame_bytes)
        self.transport: asyncio.Transport | None = None
        self.writer: FrameWriter | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport instances
        self.writer = FrameWriter(self._write, asyncio.get_running_loop().call_soon)

    def is_open(self) -> bool:
        """Connected, and not closing: what is sent now will be written."""
        return self.transport is not None and not self.transport.is_closing()

    def _write(self, parts: list[bytes]) -> None:
        if self.is_open():
            assert self.transport is not None
            self.transport.writelines(parts)

    def send(self, frame: Frame) -> None:
        """Queue ``frame``: written with the rest of this event-loop turn's (dropped once closing)."""
        if self.writer is not None:
            self.writer.send(frame)

    def close(self) -> None:
        """Write what is queued, then close the transport (which writes what it buffered first)."""
        if self.transport is not None:
            assert self.writer is not None
            self.writer.flush()
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.reader.feed(data)
        except LinkError as exc:
            log.error("%s sent what is not a frame: %s", self.peer, exc)
            self.not_frames()
            return
        for frame in frames:
            self.frame_received(frame)

    def frame_received(self, frame: Frame) -> None:
        raise NotImplementedError

    def not_frames(self) -> None:
        """After bytes that are not frames: nothing after them can be read."""
        raise NotImplementedError
