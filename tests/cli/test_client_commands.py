"""The commands that talk to a sidecar (put, get, history, sessions, fork, delete), run as a user runs them."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from ckpt.sidecar.cli.parser import CLIENT_OPTIONS
from ckpt.sidecar.client import ENV_VARS, CheckpointClient
from ckpt.v1 import service_pb2
from tests.support import ROOT, Sidecar, ckpt


def test_put_get_history_fork_delete(sidecar: Sidecar, tmp_path: Path) -> None:
    t = ("--target", sidecar.unix_target)
    state = tmp_path / "state.bin"
    state.write_bytes(b"\x08\x01\x2a\x03abc")
    out = ckpt("put", "cli", str(state), "--label", "k=v", *t)
    assert out.returncode == 0 and b'"version": "1"' in out.stdout
    assert ckpt("put", "cli", "--merge", "--expected-version", "1", *t, stdin=b"\x10\x02").returncode == 0
    assert ckpt("get", "cli", *t).stdout == b"\x08\x01\x2a\x03abc\x10\x02"
    assert ckpt("get", "cli", "--version", "1", *t).stdout == state.read_bytes()
    got = tmp_path / "out.bin"
    assert ckpt("get", "cli", "--out", str(got), *t).returncode == 0 and got.read_bytes().endswith(b"\x10\x02")
    history = ckpt("history", "cli", *t).stdout.decode().splitlines()
    assert len(history) == 2 and '"version": "2"' in history[0] and '"k": "v"' in history[1]
    assert b'"forked_from_version": "1"' in ckpt("fork", "cli", "cli2", "--version", "1", *t).stdout
    assert ckpt("delete", "cli2", *t).stdout.strip() == b'{"deleted_versions": 1}'


def test_sessions_lists_by_label_and_update_time(sidecar: Sidecar) -> None:
    t = ("--target", sidecar.unix_target)
    assert ckpt("put", "ls-a", "--label", "team=red", *t, stdin=b"\x08\x01").returncode == 0
    time.sleep(0.01)
    mid = datetime.datetime.now(datetime.UTC)
    time.sleep(0.01)
    assert ckpt("put", "ls-b", *t, stdin=b"\x08\x01").returncode == 0

    def listed(*args: str) -> list[str]:
        done = ckpt("sessions", *args, *t)
        assert done.returncode == 0, done.stderr
        return [json.loads(line)["session_id"] for line in done.stdout.decode().splitlines()]

    assert {"ls-a", "ls-b"} <= set(listed())
    assert listed("--label", "team=red") == ["ls-a"]
    assert "ls-b" in listed("--updated-after", mid.isoformat()) and "ls-a" not in listed(
        "--updated-after", mid.isoformat()
    )
    assert "ls-a" in listed("--updated-before", mid.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
    for bad, message in (
        (("--updated-after", "yesterday"), b"--updated-after 'yesterday' is not an ISO 8601 time"),
        (("--updated-before", "2026-11-21T09:30:00"), b"has no UTC offset; add Z or e.g. +01:00"),
        (("--label", "=x"), b"is not KEY=VALUE"),
    ):
        done = ckpt("sessions", *bad, *t)
        assert done.returncode == 2 and message in done.stderr and done.stdout == b"", done.stderr


def test_sessions_lists_by_id_prefix(sidecar: Sidecar) -> None:
    t = ("--target", sidecar.unix_target)
    for sid in ("run/1", "run/2", "run0", "ru", "réd/1"):
        assert ckpt("put", sid, "--label", "team=red", *t, stdin=b"\x08\x01").returncode == 0
    with CheckpointClient(sidecar.unix_target) as c:
        c.append_events("run/3", [service_pb2.Event(type="note")])  # a session of events alone

    def listed(*args: str) -> list[str]:
        done = ckpt("sessions", *args, *t)
        assert done.returncode == 0, done.stderr
        return [json.loads(line)["session_id"] for line in done.stdout.decode().splitlines()]

    assert listed("--prefix", "run/") == ["run/1", "run/2", "run/3"]
    assert listed("--prefix", "ru") == ["ru", "run/1", "run/2", "run/3", "run0"]
    assert listed("--prefix", "ré") == ["réd/1"]
    assert listed("--prefix", "run/", "--label", "team=red") == ["run/1", "run/2"]
    assert listed("--prefix", "run/", "--label", "team=blue") == []
    assert listed("--prefix", "") == ["ru", "run/1", "run/2", "run/3", "run0", "réd/1"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("put", ""), b"SESSION is empty; it must be 1-256 bytes of UTF-8"),
        (("sessions", "--prefix", "x" * 257), b"--prefix is 257 bytes; the limit is 256"),
        (("sessions", "--prefix", "a\x7fb"), b"--prefix 'a\\x7fb' contains an ASCII control character"),
        (("get", "x" * 257), b"SESSION is 257 bytes; the limit is 256"),
        (("history", "a\tb"), b"SESSION 'a\\tb' contains an ASCII control character"),
        (("delete", ""), b"SESSION is empty"),
        (("fork", "s", ""), b"NEW_SESSION is empty"),
        (("put", "s", "--label", "k" * 64 + "=v"), b"--label key '" + b"k" * 64 + b"' is 64 bytes; it must be 1-63"),
    ],
)
def test_a_bad_id_or_label_is_a_bad_command_line_even_with_no_sidecar(
    tmp_path: Path, args: tuple[str, ...], message: bytes
) -> None:
    """Checked by the sidecar's own rules before connecting: exit 2, not a connection error after ~2.6 s of retries."""
    out = ckpt(*args, "--target", f"unix:{tmp_path / 'nobody.sock'}", stdin=b"\x08\x01")
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert out.stderr.startswith(f"ckpt {args[0]}: ".encode()) and b"connect" not in out.stderr


def test_an_update_time_range_ending_before_it_starts_is_a_bad_command_line(tmp_path: Path) -> None:
    """Said in the options' own terms before connecting: exit 2, not the sidecar's fields in nanoseconds."""
    # 10:00Z is later than 10:30+01:00 (09:30Z): the instants are compared, not the text.
    after, before = "2026-11-21T10:00:00Z", "2026-11-21T10:30:00+01:00"
    t = ("--target", f"unix:{tmp_path / 'nobody.sock'}")
    out = ckpt("sessions", "--updated-after", after, "--updated-before", before, *t)
    assert out.returncode == 2 and out.stdout == b"", out.stderr
    assert out.stderr.startswith(
        f"ckpt sessions: --updated-after '{after}' is later than --updated-before '{before}'".encode()
    ), out.stderr
    assert b" ns" not in out.stderr and b"connect" not in out.stderr


def test_an_update_time_range_of_one_instant_is_sent(sidecar: Sidecar) -> None:
    t = ("--target", sidecar.unix_target)
    same = "2026-11-21T10:00:00Z"
    out = ckpt("sessions", "--updated-after", same, "--updated-before", "2026-11-21T11:00:00+01:00", *t)
    assert out.returncode == 0 and out.stdout == b"", out.stderr


def test_ids_and_labels_print_as_text_not_escapes(sidecar: Sidecar) -> None:
    t = ("--target", sidecar.unix_target)
    out = ckpt("put", "überseeq", "--label", "план=шаг", *t, stdin=b"\x08\x01")
    assert out.returncode == 0, out.stderr
    listed = ckpt("sessions", *t).stdout.decode("utf-8")
    assert '"session_id": "überseeq"' in listed and '"план": "шаг"' in listed, listed


def test_put_with_no_file_and_a_terminal_for_stdin_says_so_rather_than_wait(tmp_path: Path) -> None:
    import pty

    controller, terminal = pty.openpty()
    try:
        out = subprocess.run(
            [sys.executable, "-m", "ckpt.sidecar.cli", "put", "s", "--target", f"unix:{tmp_path / 'none.sock'}"],
            stdin=terminal,
            capture_output=True,
            cwd=ROOT,
            timeout=60,
        )
    finally:
        os.close(terminal)
        os.close(controller)
    assert out.returncode == 2
    assert out.stderr == b"ckpt put: no FILE given and stdin is a terminal: name a FILE, or pipe the state in\n"


def test_client_commands_take_the_message_limit_from_the_option_or_the_environment(
    sidecar: Sidecar, tmp_path: Path
) -> None:
    # The commands had the clients' default limit built in: a sidecar serving larger states
    # (--max-message-bytes) stored states that `ckpt get` could not read back.
    t = ("--target", sidecar.unix_target)
    big = os.urandom(300_000)
    assert ckpt("put", "big", *t, stdin=big).returncode == 0
    assert ckpt("get", "big", *t).stdout == big
    for limit in (("--max-message-bytes", "131072"), ()):
        small = ckpt("get", "big", *t, *limit, env={"CKPT_MAX_MESSAGE_BYTES": "131072"} if not limit else None)
        assert (
            small.returncode == 1 and b"over this client's message limit (--max-message-bytes = 131072)" in small.stderr
        )
    refused = ckpt("put", "big", *t, "--max-message-bytes", "131072", stdin=big)
    assert refused.returncode == 1 and b"(--max-message-bytes = 131072)" in refused.stderr
    bad = ckpt("get", "big", *t, "--max-message-bytes", "100")
    assert bad.returncode == 2 and bad.stderr == b"ckpt get: --max-message-bytes must be >= 1024, got 100\n"


def test_history_into_a_closed_pipe_stops_quietly(sidecar: Sidecar) -> None:
    t = ("--target", sidecar.unix_target)
    with CheckpointClient(sidecar.unix_target) as c:
        for n in range(1, 400):  # a few pages of history, more than a pipe buffer holds
            c.merge("p", bytes([0x10, n % 128]))
    # `ckpt history p | head -1`: the reader goes away after one line.
    cmd = [sys.executable, "-m", "ckpt.sidecar.cli", "history", "p", *t]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert b'"version": "399"' in proc.stdout.readline()
        proc.stdout.close()
        err = proc.stderr.read()
        assert proc.wait(timeout=60) == 141
    assert err == b"", err


def test_update_time_bounds_are_read_to_the_nanosecond(sidecar: Sidecar) -> None:
    t = ("--target", sidecar.unix_target)
    assert ckpt("put", "ns", *t, stdin=b"\x08\x01").returncode == 0
    with CheckpointClient(sidecar.unix_target) as c:
        (info,) = [s for s in c.sessions() if s.session_id == "ns"]
    written = info.updated_at.ToNanoseconds()

    def listed(option: str, nanoseconds: int) -> bool:
        when = Timestamp()
        when.FromNanoseconds(nanoseconds)
        text = when.ToDatetime().strftime("%Y-%m-%dT%H:%M:%S.") + f"{nanoseconds % 10**9:09d}Z"
        done = ckpt("sessions", option, text, *t)
        assert done.returncode == 0, done.stderr
        return "ns" in [json.loads(line)["session_id"] for line in done.stdout.decode().splitlines()]

    # Last written at or after --updated-after, and before --updated-before: a nanosecond either way counts.
    assert listed("--updated-after", written) and not listed("--updated-after", written + 1)
    assert listed("--updated-before", written + 1) and not listed("--updated-before", written)


@pytest.mark.parametrize(
    ("env", "flags", "message"),
    [
        (
            {"CKPT_MAX_MESSAGE_BYTES": "10"},
            (),
            b"ckpt get: --max-message-bytes (from CKPT_MAX_MESSAGE_BYTES) must be >= 1024, got 10\n",
        ),
        (
            {"CKPT_TLS_CLIENT_CERT_FILE": "agent.pem"},
            (),
            b"ckpt get: --tls-client-cert-file (from CKPT_TLS_CLIENT_CERT_FILE) and --tls-client-key-file go together:"
            b" give both or neither\n",
        ),
        (
            {"CKPT_TLS_SERVER_NAME": "ckpt.internal"},
            (),
            b"ckpt get: --tls-server-name (from CKPT_TLS_SERVER_NAME) needs --tls-ca-file (or the client certificate"
            b" options)\n",
        ),
        # The option wins over its variable, and is what the error names.
        (
            {"CKPT_MAX_MESSAGE_BYTES": "131072"},
            ("--max-message-bytes", "10"),
            b"ckpt get: --max-message-bytes must be >= 1024, got 10\n",
        ),
        (
            {"CKPT_TLS_CLIENT_CERT_FILE": "other.pem"},
            ("--tls-client-cert-file", "agent.pem"),
            b"ckpt get: --tls-client-cert-file and --tls-client-key-file go together: give both or neither\n",
        ),
    ],
)
def test_client_command_errors_name_the_variable_a_value_came_from(
    tmp_path: Path, env: dict[str, str], flags: tuple[str, ...], message: bytes
) -> None:
    out = ckpt("get", "s", "--target", f"unix:{tmp_path / 'none.sock'}", *flags, env=env)
    assert out.returncode == 2 and out.stderr == message


def test_client_commands_read_the_variables_from_env_reads() -> None:
    assert {d.name: d.env for d in CLIENT_OPTIONS} == ENV_VARS
