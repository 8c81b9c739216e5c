"""What both clients' blob methods share: the PutBlob messages cut from bytes or a file, the ArtifactRef
a stored blob is named by, and the SHA-256 a GetBlob asks for.

A blob is sent in chunks, read from its file as the stream goes (never read
whole), and fetched as a stream of chunks. PutBlob is not retried (a file
object may not be read twice); GetBlob is, only until its first chunk reaches
the caller (policy.BlobReadAttempts). A blob stream may run far longer than a
unary call, so neither has the client's ``timeout_seconds``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, BinaryIO

from ckpt.v1 import checkpoint_pb2, service_pb2

from .arguments import check_int, check_str

#: Bytes per PutBlob message unless a call says otherwise.
DEFAULT_BLOB_CHUNK_BYTES = 1024 * 1024
#: What a PutBlob message carries besides its chunk (ids and the media type): kept free of the message limit.
_ENVELOPE_BYTES = 4096
URI_PREFIX = "ckpt-blob:sha256:"
_HASH = re.compile(r"(?:ckpt-blob:sha256:|sha256:)?([0-9a-f]{64})")

#: What put_blob takes: the bytes, or a binary file object open for reading.
BlobData = bytes | bytearray | memoryview | BinaryIO


def check_put_blob(data: object, session_id: object, media_type: object, expected_sha256: object) -> None:
    check_str("session_id", session_id)
    check_str("media_type", media_type)
    check_str("expected_sha256", expected_sha256)
    if not isinstance(data, (bytes, bytearray, memoryview)) and not callable(getattr(data, "read", None)):
        raise TypeError(f"data must be bytes or a binary file object open for reading, not {type(data).__name__}")


def check_chunk_size(chunk_size_bytes: object, max_message_bytes: int) -> int:
    return check_int("chunk_size_bytes", chunk_size_bytes, low=1, high=max_message_bytes - _ENVELOPE_BYTES)


def first_request(session_id: str, media_type: str, expected_sha256: str) -> service_pb2.PutBlobRequest:
    return service_pb2.PutBlobRequest(session_id=session_id, media_type=media_type, expected_sha256=expected_sha256)


def chunk_of(piece: Any) -> bytes:
    """One piece read from a file, checked to be bytes (a text file gives str)."""
    if not isinstance(piece, (bytes, bytearray, memoryview)):
        raise TypeError(f"the blob's file gave {type(piece).__name__}, not bytes: open it in binary mode ('rb')")
    return bytes(piece)


def byte_requests(data: bytes | bytearray | memoryview, chunk_size: int) -> Iterator[service_pb2.PutBlobRequest]:
    view = memoryview(data)
    for start in range(0, len(view), chunk_size):
        yield service_pb2.PutBlobRequest(chunk=bytes(view[start : start + chunk_size]))


def file_requests(file: BinaryIO, chunk_size: int) -> Iterator[service_pb2.PutBlobRequest]:
    while piece := chunk_of(file.read(chunk_size)):
        yield service_pb2.PutBlobRequest(chunk=piece)


#: A PutBlob stream's last message: without it the sidecar takes the stream as cut short and stores nothing.
END = service_pb2.PutBlobRequest(end=True)


class ReadFailure:
    """Keeps what reading the caller's data raised (a text-mode file's TypeError from :func:`chunk_of`, a
    ``read()``'s OSError) out of gRPC, which runs the request iterator and would report it as an error of
    its own (the sync client's UNKNOWN "Exception iterating requests!", the async client's CancelledError).
    The stream ends there without :data:`END`, so the sidecar stores nothing; put_blob then raises the
    error itself through :meth:`raise_it`."""

    def __init__(self) -> None:
        self.error: Exception | None = None

    def guard(self, requests: Iterator[service_pb2.PutBlobRequest]) -> Iterator[service_pb2.PutBlobRequest]:
        """``requests`` (ending with END) until one raises: then the stream ends, cut short."""
        try:
            yield from requests
        except Exception as exc:
            self.error = exc

    def raise_it(self) -> None:
        """Raise the kept error, if any (outside any ``except``: it stays as the caller's read raised it)."""
        if self.error is not None:
            error, self.error = self.error, None
            raise error


class Cut:
    """Ends a PutBlob stream short once its put_blob was interrupted (a Ctrl-C): no further chunk is read
    or sent, so :data:`END` is not sent unless it went before, and the sidecar stores nothing."""

    def __init__(self) -> None:
        self._cut = False

    def cut(self) -> None:
        self._cut = True  # an attribute set: a signal cannot leave it half done

    def guard(self, requests: Iterator[service_pb2.PutBlobRequest]) -> Iterator[service_pb2.PutBlobRequest]:
        """``requests`` until cut: looked at before each is read (a read from the caller's file), and after."""
        while not self._cut:
            message = next(requests, None)
            if message is None or self._cut:
                return
            yield message


def artifact_ref(response: service_pb2.PutBlobResponse, media_type: str) -> checkpoint_pb2.ArtifactRef:
    """The ArtifactRef naming a stored blob (put it in a checkpoint's ``artifacts``)."""
    return checkpoint_pb2.ArtifactRef(
        uri=response.uri or URI_PREFIX + response.sha256,
        content_hash=f"sha256:{response.sha256}",
        size_bytes=response.size_bytes,
        media_type=media_type,
    )


def get_blob_request(ref: object, offset: object, length: object) -> service_pb2.GetBlobRequest:
    """A GetBlob of ``ref``: an ArtifactRef, its uri, "sha256:<hex>" or the hex alone."""
    return service_pb2.GetBlobRequest(
        sha256=blob_sha256(ref), offset=check_int("offset", offset), length=check_int("length", length)
    )


def blob_sha256(ref: object) -> str:
    """The SHA-256 (hex) ``ref`` names."""
    if isinstance(ref, checkpoint_pb2.ArtifactRef):
        text = ref.uri if ref.uri.startswith(URI_PREFIX) else ref.content_hash
    elif isinstance(ref, str):
        text = ref
    else:
        raise TypeError(f"ref must be a ckpt.v1.ArtifactRef or a str, not {type(ref).__name__}")
    found = _HASH.fullmatch(text)
    if found is None:
        raise ValueError(
            f"ref {text[:100]!r} names no blob: give an ArtifactRef, {URI_PREFIX}<hex>, sha256:<hex> or the 64"
            " lowercase hex digits of its SHA-256"
        )
    return found[1]
