"""The commands that talk to a running sidecar: put, get, history, sessions, fork, delete, register-type."""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path

from google.protobuf.timestamp_pb2 import Timestamp

from .. import ids
from ..client import CheckpointClient
from ..client.arguments import unix_nanos
from ..descriptors import check_type_name
from ..errors import InvalidArgument
from ..limits import FILTER_TIME_RANGE, MAX_FILTER_TIME_NANOS, MIN_FILTER_TIME_NANOS
from ..tls import ClientTLS, client_tls_from_files
from .output import print_json, to_file, to_stdout, write_all
from .parser import in_option_terms


def client_of(args: argparse.Namespace) -> CheckpointClient:
    """The client the command line sets up (--target, TLS, --max-message-bytes), its ids checked."""
    # Ids are checked here, by the sidecar's own rules, so that a bad one is a
    # bad command line (exit 2), said at once: not an error from the sidecar,
    # nor, with none running, retried for ~2.6 s and reported as a connection failure.
    for name, field in (("session", "SESSION"), ("new_session", "NEW_SESSION")):
        value = getattr(args, name, None)
        if value is not None:
            try:
                ids.session_key(value, field=field)
            except InvalidArgument as exc:
                raise ValueError(str(exc)) from None
    target = args.target or f"unix:{args.data_dir.resolve() / 'ckpt.sock'}"
    try:
        return CheckpointClient(target, max_message_bytes=args.max_message_bytes, tls=_client_tls(args))
    except ValueError as exc:
        raise ValueError(in_option_terms(str(exc), args)) from None


def _client_tls(args: argparse.Namespace) -> ClientTLS | bool:
    tls = client_tls_from_files(
        ca_file=args.tls_ca_file,
        cert_file=args.tls_client_cert_file,
        key_file=args.tls_client_key_file,
        server_name=args.tls_server_name,
    )
    return False if tls is None else tls


def _labels(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--label {pair!r} is not KEY=VALUE (a non-empty KEY)")
        out[key] = value
    try:
        ids.check_labels(out, field="--label")
    except InvalidArgument as exc:
        raise ValueError(str(exc)) from None
    return out


def check_stdin(lead: str, what: str) -> None:
    """Reading ``what`` from stdin: OSError if it is closed (``<&-``: Python's ``sys.stdin`` is None then),
    ValueError if it is a terminal (the command would wait on it)."""
    if sys.stdin is None:
        raise OSError(f"{lead} and stdin is closed: name a FILE, or pipe the {what} in")
    if sys.stdin.isatty():
        raise ValueError(f"{lead} and stdin is a terminal: name a FILE, or pipe the {what} in")


def put(args: argparse.Namespace) -> int:
    labels = _labels(args.label)
    if args.message_type is not None:
        try:
            check_type_name(args.message_type, field="--type")
        except InvalidArgument as exc:
            raise ValueError(str(exc)) from None
    if args.file == "-":
        check_stdin("no FILE given", "state")
    with client_of(args) as c:  # the ids are checked before the state is read
        data = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
        write = c.merge if args.merge else c.put
        r = write(
            args.session,
            data,
            message_type=args.message_type,
            expected_version=args.expected_version,
            request_id=args.request_id,
            labels=labels,
        )
    print_json(r)
    return 0


def get(args: argparse.Namespace) -> int:
    with client_of(args) as c:
        r = c.get(args.session, args.version)
    if args.out:
        to_file(args.out, lambda f: write_all(f, r.state))
        print(f"version {r.version}: {len(r.state)} bytes -> {args.out}", file=sys.stderr)
    else:
        to_stdout(r.state)
    return 0


def history(args: argparse.Namespace) -> int:
    with client_of(args) as c:
        for info in c.history(args.session):
            print_json(info, omit=("state",))  # listed without states
    return 0


# A time's fraction of a second, apart from the rest: up to 9 digits (nanoseconds), which fromisoformat cuts
# to microseconds, while event times (printed by `ckpt events`) carry nanoseconds.
_FRACTION = re.compile(r"(?P<head>.*?\d)[.,](?P<fraction>\d+)(?P<tail>Z|[+-].*)?", re.ASCII)


def _time_arg(option: str, text: str | None) -> Timestamp | None:
    """``text`` (ISO 8601 with a UTC offset or Z, to the nanosecond) as a Timestamp; None for None."""
    if text is None:
        return None
    fraction = _FRACTION.fullmatch(text)
    try:
        when = datetime.datetime.fromisoformat(fraction["head"] + (fraction["tail"] or "") if fraction else text)
    except ValueError:
        raise ValueError(f"{option} {text!r} is not an ISO 8601 time (e.g. 2026-11-21T09:30:00Z)") from None
    if when.tzinfo is None:
        raise ValueError(f"{option} {text!r} has no UTC offset; add Z or e.g. +01:00")
    if fraction and len(fraction["fraction"]) > 9:
        raise ValueError(f"{option} {text!r} has a fraction of a second finer than nanoseconds (9 digits at most)")
    nanos = unix_nanos(when)
    if fraction:  # added, not set: an offset may carry a fraction of its own (+01:00:30.25)
        nanos += int(fraction["fraction"].ljust(9, "0"))
    if not MIN_FILTER_TIME_NANOS <= nanos <= MAX_FILTER_TIME_NANOS:
        raise ValueError(f"{option} {text!r} is out of range: it must be a time from {FILTER_TIME_RANGE}")
    ts = Timestamp()
    ts.FromNanoseconds(nanos)
    return ts


def sessions(args: argparse.Namespace) -> int:
    labels = _labels(args.label)
    after = _time_arg("--updated-after", args.updated_after)
    before = _time_arg("--updated-before", args.updated_before)
    if after is not None and before is not None and after.ToNanoseconds() > before.ToNanoseconds():
        raise ValueError(
            f"--updated-after {args.updated_after!r} is later than --updated-before {args.updated_before!r}:"
            " no session could match (the listing is of sessions last written at or after --updated-after"
            " and before --updated-before)"
        )
    if args.prefix:  # by the session id rules, as ids are (client_of): no id begins with one they refuse
        try:
            ids.session_key(args.prefix, field="--prefix")
        except InvalidArgument as exc:
            raise ValueError(str(exc)) from None
    with client_of(args) as c:
        for info in c.sessions(labels=labels, updated_after=after, updated_before=before, prefix=args.prefix):
            print_json(info)
    return 0


def fork(args: argparse.Namespace) -> int:
    with client_of(args) as c:
        print_json(c.fork(args.session, args.new_session, version=args.version, copy_events=args.copy_events))
    return 0


def delete(args: argparse.Namespace) -> int:
    with client_of(args) as c:
        print(json.dumps({"deleted_versions": c.delete(args.session)}))
    return 0


def register_type(args: argparse.Namespace) -> int:
    data = args.file.read_bytes()
    with client_of(args) as c:
        names = c.register_type(data)
    print(json.dumps({"message_types": names}))
    return 0
