"""`ckpt events`: a session's event log, one JSON object a line; with --follow, new events as they come."""

from __future__ import annotations

import argparse
import sys
import time

from google.protobuf.timestamp_pb2 import Timestamp

from .. import ids
from ..client import CheckpointClient, EventFilter, NotFoundError
from ..client.events import event_page
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
    seen = 0  # the seq of the last event printed (0: none yet)
    log: int | None = None  # when the log read was created, as the sidecar says (0: the session has none)
    with client_of(args) as c:
        while True:
            try:
                seen, log = _print_after(c, args, since, seen, log)
            except _LogRemade:
                return _stop(args, "was deleted (and written again) while following: its log began anew")
            except NotFoundError:
                if log is None:
                    raise
                return _stop(args, "was deleted while following")
            if not args.follow:
                return 0
            # Flushed per poll: a reader of a pipe (`ckpt events s --follow | jq`) sees each event as it comes.
            print(end="", flush=True)
            time.sleep(args.poll_seconds)


def _print_after(
    c: CheckpointClient, args: argparse.Namespace, since: Timestamp | None, seen: int, log: int | None
) -> tuple[int, int]:
    """Prints the events after seq ``seen`` of the log created at ``log`` (None: the first read); returns
    the seq of the last printed and when the log read was created.

    Every page says when its log was created: a log deleted and written again (numbered from 1 again)
    has another time (_LogRemade), whatever events it holds; so has a log made since a read that found
    none, which is read from its start (nothing was printed). Retention drops events from the front of a
    log only, and never renumbers it: what is left after ``seen`` is read as it is."""
    read = EventFilter(after_seq=seen, types=args.type, after=since, page_size=1000)
    token = ""
    while True:
        page = event_page(c, args.session, read, token)
        created = page.log_created_at.ToNanoseconds() if page.HasField("log_created_at") else 0
        if log and created != log:
            raise _LogRemade
        log = created
        for event in page.events:
            print_json(event)
            seen = event.seq
        token = page.next_page_token
        if not token:
            return seen, log


def _stop(args: argparse.Namespace, what: str) -> int:
    print(f"ckpt events: session {args.session!r} {what}; run ckpt events again", file=sys.stderr)
    return 1
