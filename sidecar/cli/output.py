"""What the commands print: messages as JSON lines, times as RFC 3339, errors as sentences; bytes written whole."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from google.protobuf.json_format import MessageToDict
from google.protobuf.timestamp_pb2 import Timestamp

from ..wholewrites import write_whole


def print_json(message: Any, *, omit: tuple[str, ...] = ()) -> None:
    """A protobuf message as one line of JSON, its fields by their proto names, those without presence at
    their defaults too (``head_version`` 0, ``size_bytes`` "0", ``payload`` ""): every field documented is
    there. ``omit``: fields the command never fills (``VersionInfo.state`` outside ``include_states``)."""
    fields = MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    for name in omit:
        fields.pop(name, None)
    # Text as it is (UTF-8), not \u escapes: session ids and labels are read by people too.
    print(json.dumps(fields, sort_keys=True, ensure_ascii=False))


@contextlib.contextmanager
def writing(name: str, outcome: str = "") -> Iterator[None]:
    """The OSErrors raised within as failures to write ``name`` ("stdout", a FILE's repr), ``outcome``
    after, but a broken pipe's (the reader went away: main.py stops quietly)."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise OSError(f"cannot write {name}: {sentence(exc)}{outcome}") from None


def to_stdout(data: bytes | Iterable[bytes]) -> int:
    """Bytes (or chunks of them) to stdout, every one (:func:`write_all`), flushed; how many. OSError naming
    stdout if they cannot all be written: the reader has a part only."""
    written = 0
    with writing("stdout", "; what it got is cut short"):
        sys.stdout.flush()  # anything printed before comes first
        for chunk in [data] if isinstance(data, bytes) else data:
            write_all(sys.stdout.buffer, chunk)
            written += len(chunk)
        sys.stdout.flush()
    return written


def to_file(path: Path, write: Callable[[BinaryIO], int]) -> int:
    """``write`` (bytes written) run on FILE.partial, renamed ``path`` once whole: the file is whole or not
    there. OSError naming ``path`` if it cannot be written.

    A symlink is followed (the file it names is replaced, not the link), and a path that is no regular file
    (/dev/null, a named pipe, /dev/stdout) is written in place: renaming over it would replace a device with
    a file, as root, or fail."""
    target = Path(os.path.realpath(path))
    with writing(repr(str(path))):
        try:
            regular = stat.S_ISREG(os.stat(target).st_mode)
        except FileNotFoundError:
            regular = True  # made new, whole or not at all
        if not regular:
            with open(target, "wb") as f:
                return write(f)
    partial = target.with_name(target.name + ".partial")
    try:
        with writing(repr(str(path))):
            with open(partial, "wb") as f:
                written = write(f)
            partial.replace(target)
        return written
    finally:
        partial.unlink(missing_ok=True)


def write_all(file: BinaryIO, data: bytes) -> int:
    """Every byte of ``data`` into ``file`` (wholewrites.write_whole), or OSError; ``len(data)``."""
    write_whole(file, data)
    return len(data)


def require_stdout() -> None:
    """OSError unless stdout is open (a script's `cmd >&-`: Python's ``sys.stdout`` is None then, and
    ``print`` writes nothing without an error)."""
    if sys.stdout is None:
        raise OSError("stdout is closed and the command prints to it: redirect it (to /dev/null to discard)")


def utc(unix_nanos: int) -> str:
    """RFC 3339 in UTC, as ``history`` prints a version's ``created_at`` (protobuf's JSON form of a Timestamp)."""
    when = Timestamp()
    when.FromNanoseconds(unix_nanos)
    return when.ToJsonString()


def sentence(exc: Exception) -> str:
    """An error as the command says it: an OSError without Python's "[Errno 17]" in front."""
    if isinstance(exc, OSError) and exc.strerror:
        names = [repr(name) for name in (exc.filename, exc.filename2) if name is not None]
        return exc.strerror + (": " + " -> ".join(names) if names else "")
    return str(exc)
