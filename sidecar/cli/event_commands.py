"""`ckpt events`: a session's event log, one JSON object a line; with --follow, new events as they come."""

from __future__ import annotations

import argparse
import time

from google.protobuf.timestamp_pb2 import Timestamp

from .. import ids
from ..errors import InvalidArgument
from .client_commands import _time_arg, client_of
from .output import print_json


def events(args: argparse.Namespace) -> int:
    for name in args.type:
        try:
            ids.check_event_type(name, "--type")
        except InvalidArgument as exc:
            raise ValueError(str(exc)) from None
    if not args.poll_seconds > 0:
        raise ValueError(f"--poll-seconds must be > 0, got {args.poll_seconds}")
    since = _time_arg("--since", args.since)
    try:
        return _print_events(args, since)
    except KeyboardInterrupt:
        if args.follow:  # how a follow ends: not a failure
            return 0
        raise


def _print_events(args: argparse.Namespace, since: Timestamp | None) -> int:
    last = 0
    with client_of(args) as c:
        while True:
            for event in c.events(args.session, after_seq=last, types=args.type, after=since, page_size=1000):
                print_json(event)
                last = event.seq
            if not args.follow:
                return 0
            # Flushed per poll: a reader of a pipe (`ckpt events s --follow | jq`) sees each event as it comes.
            print(end="", flush=True)
            time.sleep(args.poll_seconds)
