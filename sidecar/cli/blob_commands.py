"""`ckpt blob put SESSION FILE` and `ckpt blob get REF`: artifacts stored by reference, through a sidecar."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import ids
from ..client.blobs import blob_sha256
from ..errors import InvalidArgument
from .client_commands import client_of
from .output import print_json


def blob(args: argparse.Namespace) -> int:
    if args.action == "put":
        return _put(args)
    return _get(args)


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
    if args.file == "-" and sys.stdin.isatty():
        raise ValueError("FILE is - and stdin is a terminal: name a FILE, or pipe the blob in")
    with client_of(args) as c:
        if args.file == "-":
            ref = c.put_blob(sys.stdin.buffer, session_id=args.subject, media_type=args.media_type)
        else:
            with open(args.file, "rb") as f:
                ref = c.put_blob(f, session_id=args.subject, media_type=args.media_type)
    print_json(ref)
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
            written = c.get_blob_to(args.subject, sys.stdout.buffer, offset=offset, length=length)
            sys.stdout.flush()
            return 0
        partial = args.out.with_name(args.out.name + ".partial")
        try:
            with open(partial, "wb") as f:
                written = c.get_blob_to(args.subject, f, offset=offset, length=length)
            partial.replace(args.out)  # the file is whole, or not there
        finally:
            Path(partial).unlink(missing_ok=True)
    print(f"{written} bytes -> {args.out}", file=sys.stderr)
    return 0
