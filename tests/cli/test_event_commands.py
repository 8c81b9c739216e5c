"""`ckpt events` as a user runs it: filters, --since, and --follow until interrupted."""

from __future__ import annotations

import datetime
import json
import signal
import subprocess
import sys
import time

from google.protobuf.timestamp_pb2 import Timestamp

from ckpt.sidecar.client import CheckpointClient, event
from tests.support import ROOT, Sidecar, ckpt

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def lines(done: subprocess.CompletedProcess[bytes]) -> list[dict[str, object]]:
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.decode().splitlines()]


def test_events_lists_filters_and_follows(sidecar: Sidecar) -> None:
    t = ("--target", sidecar.unix_target)
    with CheckpointClient(sidecar.unix_target) as c:
        at = [T0 + datetime.timedelta(seconds=i) for i in range(3)]
        c.append_events(
            "s", [event("tool", b'{"n": 1}', time=at[0]), event("msg", b"hi", time=at[1]), event("tool", time=at[2])]
        )
        listed = lines(ckpt("events", "s", *t))
        assert [e["seq"] for e in listed] == ["1", "2", "3"] and listed[1]["type"] == "msg"
        assert [e["seq"] for e in lines(ckpt("events", "s", "--type", "tool", *t))] == ["1", "3"]
        assert listed[0]["time"] == "2026-01-01T00:00:00Z" and listed[1]["payload"] == "aGk="  # JSON: base64
        assert [e["seq"] for e in lines(ckpt("events", "s", "--since", "2026-01-01T00:00:00.5Z", *t))] == ["2", "3"]
        bad = ckpt("events", "s", "--since", "yesterday", *t)
        assert bad.returncode == 2 and b"--since 'yesterday' is not an ISO 8601 time" in bad.stderr
        missing = ckpt("events", "nobody", *t)
        assert missing.returncode == 1 and b"'nobody' does not exist" in missing.stderr
        with subprocess.Popen(
            [sys.executable, "-m", "ckpt.sidecar.cli", "events", "s", "--follow", "--poll-seconds", "0.05", *t],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
        ) as follow:
            try:
                assert follow.stdout is not None
                seen = [json.loads(follow.stdout.readline()) for _ in range(3)]
                c.append_events("s", [event("later")])
                seen.append(json.loads(follow.stdout.readline()))  # printed by a later poll
                assert [e["seq"] for e in seen] == ["1", "2", "3", "4"] and seen[3]["type"] == "later"
            finally:
                time.sleep(0.1)
                follow.send_signal(signal.SIGINT)
                assert follow.wait(timeout=30) == 0


def test_since_the_printed_time_of_an_event_prints_only_later_ones_to_the_nanosecond(sidecar: Sidecar) -> None:
    t = ("--target", sidecar.unix_target)
    with CheckpointClient(sidecar.unix_target) as c:
        # Times apart by nanoseconds: a microsecond reading of --since would take in all three.
        at = [Timestamp(seconds=1_767_225_600, nanos=956_706_043 + n) for n in range(3)]
        c.append_events("ns", [event("e", time=when) for when in at])
        printed = lines(ckpt("events", "ns", *t))
        assert [e["time"] for e in printed] == [when.ToJsonString() for when in at]
        assert printed[0]["time"] == "2026-01-01T00:00:00.956706043Z"
        later = lines(ckpt("events", "ns", "--since", str(printed[0]["time"]), *t))
        assert [e["seq"] for e in later] == ["2", "3"]
        # The same instant in another offset, and a fraction finer than nanoseconds, which no time holds.
        assert [
            e["seq"] for e in lines(ckpt("events", "ns", "--since", "2026-01-01T01:00:00.956706044+01:00", *t))
        ] == ["3"]
        bad = ckpt("events", "ns", "--since", "2026-01-01T00:00:00.9567060431Z", *t)
        assert bad.returncode == 2 and b"finer than nanoseconds (9 digits at most)" in bad.stderr
