"""What the commands print: messages as JSON lines, times as RFC 3339, errors as sentences."""

from __future__ import annotations

import json
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.timestamp_pb2 import Timestamp


def print_json(message: Any) -> None:
    """A protobuf message as one line of JSON, its fields by their proto names."""
    # Text as it is (UTF-8), not \u escapes: session ids and labels are read by people too.
    print(json.dumps(MessageToDict(message, preserving_proto_field_name=True), sort_keys=True, ensure_ascii=False))


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
