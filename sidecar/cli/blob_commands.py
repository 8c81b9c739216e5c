"""`ckpt blob put SESSION FILE` and `ckpt blob get REF`: artifacts stored by reference, through a sidecar."""

from __future__ import annotations

import argparse
import os
import sys
from typing import BinaryIO, cast

from .. import ids
from ..client.blobs import blob_sha256
from ..errors import InvalidArgument
from .client_commands import check_stdin, client_of
from .output import print_json, to_file, to_stdout


def blob(args: argparse.Namespace) -> int:
    if args.action == "put":
        return _put(args)
    return _get(args)


class _Stdin:
    """stdin read with os.read on its descriptor, a ``read(n)`` filling ``n`` bytes but at its end.

    gRPC reads a PutBlob's requests, so the file, on a thread of its own. Reading ``sys.stdin.buffer``
    there, that thread held the buffer's lock while it waited for input; after Ctrl-C the interpreter
    stopped with it still held and aborted ("Fatal Python error: _enter_buffered_busy", SIGABRT). A
    descriptor has no lock to hold: the command exits 130, and nothing is stored (the stream never ends).
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def read(self, size: int) -> bytes:
        parts, wanted = [], size
        while wanted > 0:
            part = os.read(self.fd, wanted)
            if not part:
                break
            parts.append(part)
            wanted -= len(part)
        return b"".join(parts)


def _put(args: argparse.Namespace) -> int:
    if args.file is None:
        raise ValueError("blob put needs SESSION and FILE (- for stdin)")
    for option in ("out", "offset", "length"):
        if getattr(args, option) is not None:
            raise ValueError(f"--{option} is an option of blob get, not blob put")
    try:
        ids.session_key(args.subject, field="SESSION")
    except InvalidArgument as exc:
        raise ValueError(str(exc)) from None
    if args.file == "-":
        check_stdin("FILE is -", "blob")
    with client_of(args) as c:
        if args.file == "-":
            stdin = cast(BinaryIO, _Stdin(sys.stdin.fileno()))
            ref = c.put_blob(stdin, session_id=args.subject, media_type=args.media_type)
        else:
            with open(args.file, "rb") as f:
                ref = c.put_blob(f, session_id=args.subject, media_type=args.media_type)
    print_json(ref, omit=("digest",))  # what blob put fills: uri, content_hash, size_bytes, media_type
    return 0


def _get(args: argparse.Namespace) -> int:
    if args.file is not None:
        raise ValueError(f"blob get takes one REF (got {args.file!r} too); write to a file with --out FILE")
    if args.media_type:
        raise ValueError("--media-type is an option of blob put, not blob get")
    blob_sha256(args.subject)  # a bad REF is a bad command line, said before connecting
    offset, length = args.offset or 0, args.length or 0
    with client_of(args) as c:
        if args.out is None:
            to_stdout(c.get_blob(args.subject, offset=offset, length=length))
            return 0
        written = to_file(args.out, lambda f: c.get_blob_to(args.subject, f, offset=offset, length=length))
    print(f"{written} bytes -> {args.out}", file=sys.stderr)
    return 0
