"""Bytes written whole: every byte given, or OSError.

A write may take fewer bytes than given without an error (``sys.stdout.buffer``
on a full disk or past RLIMIT_FSIZE, a file on a filling disk), so each write is
given the rest until none is left. Shared by the clients' get_blob_to and the
command line's output; imports nothing heavy (the command line loads it before
grpc).
"""

from __future__ import annotations

from typing import BinaryIO


def write_whole(file: BinaryIO, chunk: bytes) -> None:
    """Write all of ``chunk`` to ``file``: a write taking fewer bytes than given is given the rest again,
    which raises the error (ENOSPC, EFBIG); one taking none (0) raises OSError."""
    view = memoryview(chunk)
    while view:
        taken = file.write(view)
        if taken == 0:
            raise OSError(f"a write took none of the {len(view)} bytes left")
        view = view[len(view) if taken is None else taken :]  # None: a file object that returns nothing
