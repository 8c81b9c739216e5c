"""`ckpt events`: a session's event log, one JSON object a line; with --follow, new events as they come."""

from __future__ import annotations

import argparse
import sys
import time

from google.protobuf.timestamp_pb2 import Timestamp

from ckpt.v1.service_pb2 import Event

from .. import ids
from ..client import CheckpointClient, NotFoundError
from ..errors import InvalidArgument
from .client_commands import _time_arg, client_of
from .output import print_json


def events(args: argparse.Namespace) -> int:
    for name in args.type:
        try:
            ids.check_event_type(name, "--type")
        except InvalidArgument as exc:
            raise ValueError(str(exc)) from None
    since = _time_arg("--since", args.since)
    try:
        return _print_events(args, since)
    except KeyboardInterrupt:
        if args.follow:  # how a follow ends: not a failure
            return 0
        raise


class _LogRemade(Exception):
    """The session followed was deleted and written again: its log numbers its events from 1 anew."""


def _print_events(args: argparse.Namespace, since: Timestamp | None) -> int:
    seen: Event | None = None  # the last event printed
    with client_of(args) as c:
        while True:
            try:
                seen = _print_after(c, args, since, seen)
            except _LogRemade:
                return _stop(args, "was deleted (and written again) while following: its log began anew")
            except NotFoundError:
                if seen is None:
                    raise
                return _stop(args, "was deleted while following")
            if not args.follow:
                return 0
            # Flushed per poll: a reader of a pipe (`ckpt events s --follow | jq`) sees each event as it comes.
            print(end="", flush=True)
            time.sleep(args.poll_seconds)


def _print_after(
    c: CheckpointClient, args: argparse.Namespace, since: Timestamp | None, seen: Event | None
) -> Event | None:
    """Prints the events after ``seen`` (the last printed; None: none yet) and returns the last printed.

    The read starts at ``seen`` itself, which it finds again first while the log is the one it was read
    from: one read (its first page one reply) both checks that and reads on. Missing, it was dropped by
    retention (from the front of the log only) or its log was remade (_LogRemade): the log then holds an
    older seq, or the same seq as another event."""
    read = c.events(
        args.session, after_seq=seen.seq - 1 if seen is not None else 0, types=args.type, after=since, page_size=1000
    )
    first = seen is not None
    for event in read:
        if first:
            first = False
            if event == seen:
                continue
            _check_dropped(c, args.session, seen)
        print_json(event)
        seen = event
    if first:  # nothing read, not even ``seen``
        _check_dropped(c, args.session, seen)
    return seen


def _check_dropped(c: CheckpointClient, session: str, seen: Event | None) -> None:
    """Raises _LogRemade unless ``seen`` is missing from the session's log because retention dropped it."""
    assert seen is not None
    oldest = next(iter(c.events(session, page_size=1)), None)
    if oldest is not None and oldest.seq <= seen.seq:
        raise _LogRemade


def _stop(args: argparse.Namespace, what: str) -> int:
    print(f"ckpt events: session {args.session!r} {what}; run ckpt events again", file=sys.stderr)
    return 1
