"""`ckpt events` as a user runs it: filters, --since, and --follow until interrupted."""

from __future__ import annotations

import datetime
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from ckpt.sidecar.client import CheckpointClient, event
from tests.support import ROOT, Sidecar, ckpt, start_sidecar

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


_POLL = ("--poll-seconds", "0.05")
#: Polls 2 s apart: what a test does right after one poll printed is done before the next.
_SLOW_POLL = ("--poll-seconds", "2")


def _follow(sidecar: Sidecar, session: str, poll: tuple[str, str] = _POLL) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ckpt.sidecar.cli",
            "events",
            session,
            "--follow",
            *poll,
            "--target",
            sidecar.unix_target,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )


def _ended(follow: subprocess.Popen[bytes]) -> tuple[bytes, bytes]:
    """What a follow printed until it ended by itself: killed (and the test failed) if it goes on."""
    try:
        return follow.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        follow.kill()
        out, err = follow.communicate()
        pytest.fail(f"still following after 30 s, having printed {out!r} {err!r}")


def test_follow_stops_with_a_failure_when_its_session_is_deleted_and_written_again(sidecar: Sidecar) -> None:
    with CheckpointClient(sidecar.unix_target) as c:
        c.append_events("remade", [event("old", str(n).encode()) for n in range(3)])
        with _follow(sidecar, "remade") as follow:
            assert follow.stdout is not None
            assert [json.loads(follow.stdout.readline())["seq"] for _ in range(3)] == ["1", "2", "3"]
            c.delete("remade")
            # A new log, numbered from 1 again and past the last seq printed: none of it is skipped silently.
            c.append_events("remade", [event("new", str(n).encode()) for n in range(4)])
            out, err = _ended(follow)
        assert follow.returncode == 1 and out == b"", err
        assert err.decode() == (
            "ckpt events: session 'remade' was deleted (and written again) while following: its log began anew;"
            " run ckpt events again\n"
        )
        c.append_events("gone", [event("e")])
        with _follow(sidecar, "gone") as follow:
            assert follow.stdout is not None
            assert json.loads(follow.stdout.readline())["seq"] == "1"
            c.delete("gone")
            out, err = _ended(follow)
        assert follow.returncode == 1 and out == b"", err
        assert err == b"ckpt events: session 'gone' was deleted while following; run ckpt events again\n"


def test_follow_notices_a_log_written_again_whose_event_at_the_last_seq_printed_is_the_same(
    sidecar: Sidecar,
) -> None:
    """The new log's event at the last seq printed equals the old one (type, payload, time): the follow
    must not take it for the old log and print on from there, skipping the new log's first events."""
    when = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    with CheckpointClient(sidecar.unix_target) as c:
        c.append_events("twin", [event("e", str(n).encode(), time=when) for n in range(3)])
        follow = _follow(sidecar, "twin", _SLOW_POLL)
        with follow:
            assert follow.stdout is not None
            assert [json.loads(follow.stdout.readline())["seq"] for _ in range(3)] == ["1", "2", "3"]
            c.delete("twin")
            # seq 3 of the new log is seq 3 of the old, byte for byte; seqs 1 and 2 are new events.
            c.append_events("twin", [event("new", time=when), event("new", time=when)])
            c.append_events("twin", [event("e", b"2", time=when), event("after")])
            out, err = _ended(follow)
        assert follow.returncode == 1 and out == b"", (out, err)
        assert err.decode() == (
            "ckpt events: session 'twin' was deleted (and written again) while following: its log began anew;"
            " run ckpt events again\n"
        )


def test_follow_goes_on_past_events_retention_dropped_after_they_were_printed(tmp_path: Path) -> None:
    sidecar = start_sidecar(tmp_path / "data", "--keep-last-events", "2", "--sweep-interval-seconds", "0.1")
    try:
        with CheckpointClient(sidecar.unix_target) as c:
            c.append_events("kept", [event("e") for _ in range(3)])
            _wait_for_first_seq(c, "kept", 2)
            follow = _follow(sidecar, "kept", _SLOW_POLL)
            with follow:
                assert follow.stdout is not None
                assert [json.loads(follow.stdout.readline())["seq"] for _ in range(2)] == ["2", "3"]
                # Between two polls: seq 3, the last printed, is dropped, and so is seq 4.
                c.append_events("kept", [event("e") for _ in range(3)])
                _wait_for_first_seq(c, "kept", 5)
                assert [json.loads(follow.stdout.readline())["seq"] for _ in range(2)] == ["5", "6"]
                follow.send_signal(signal.SIGINT)
                assert follow.wait(timeout=30) == 0, follow.stderr.read() if follow.stderr else b""
    finally:
        assert sidecar.stop() == 0, sidecar.log()


def _wait_for_first_seq(c: CheckpointClient, session: str, seq: int) -> None:
    deadline = time.monotonic() + 30
    while next(iter(c.events(session, page_size=1))).seq != seq:
        assert time.monotonic() < deadline, f"retention kept {[e.seq for e in c.events(session)]}"
        time.sleep(0.02)


def test_follow_of_a_session_without_events_prints_the_first_ones_of_its_new_log(sidecar: Sidecar) -> None:
    with CheckpointClient(sidecar.unix_target) as c:
        c.put("quiet", b"state")
        with _follow(sidecar, "quiet") as follow:
            assert follow.stdout is not None
            time.sleep(0.3)  # polls that find no log
            c.append_events("quiet", [event("first"), event("second")])
            assert [json.loads(follow.stdout.readline())["type"] for _ in range(2)] == ["first", "second"]
            c.append_events("quiet", [event("third")])
            assert json.loads(follow.stdout.readline())["seq"] == "3"
            follow.send_signal(signal.SIGINT)
            assert follow.wait(timeout=30) == 0


FILTER_RANGE = b"it must be a time from 0001-01-01T00:00:00Z to 2554-07-21T23:34:33.709551615Z"


@pytest.mark.parametrize(
    ("command", "option", "when"),
    [
        (("events", "s"), "--since", "0001-01-01T00:00:00+01:00"),  # before year 1 in UTC: was a traceback
        (("events", "s"), "--since", "9999-12-31T23:59:59-01:00"),  # after year 9999 in UTC: likewise
        (("events", "s"), "--since", "9999-12-31T23:59:59Z"),  # was the sidecar's error, naming `after`
        (("sessions",), "--updated-after", "0001-01-01T00:00:00+01:00"),
        (("sessions",), "--updated-before", "2554-07-21T23:34:34Z"),
    ],
)
def test_a_time_option_the_sidecar_cannot_hold_is_a_bad_command_line_naming_the_option_and_the_range(
    sidecar: Sidecar, command: tuple[str, ...], option: str, when: str
) -> None:
    out = ckpt(*command, option, when, "--target", sidecar.unix_target)
    assert out.returncode == 2 and out.stdout == b"", out.stderr
    assert (
        out.stderr.decode().strip() == f"ckpt {command[0]}: {option} {when!r} is out of range: {FILTER_RANGE.decode()}"
    )


def test_time_options_at_the_ends_of_the_range_are_sent(sidecar: Sidecar) -> None:
    t = ("--target", sidecar.unix_target)
    with CheckpointClient(sidecar.unix_target) as c:
        c.append_events("ends", [event("t")])
        c.put("ends", b"v1")
    assert len(lines(ckpt("events", "ends", "--since", "0001-01-01T00:30:00+00:30", *t))) == 1
    assert lines(ckpt("events", "ends", "--since", "2554-07-21T23:34:33.709551615Z", *t)) == []
    listed = lines(ckpt("sessions", "--updated-after", "0001-01-01T00:00:00Z", *t))
    assert "ends" in [s["session_id"] for s in listed]
