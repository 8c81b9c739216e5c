"""The ckpt command line, run as a user runs it."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest

from ckpt.sidecar.client import CheckpointClient, InvalidArgumentError
from ckpt.sidecar.config import ServeConfig
from ckpt.v1 import checkpoint_pb2 as pb
from tests.sidecar_proc import ROOT, Sidecar, free_port, start_sidecar


def ckpt(*args: str, stdin: bytes = b"", env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "ckpt.sidecar.cli", *args],
        input=stdin,
        capture_output=True,
        cwd=ROOT,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    s = start_sidecar(tmp_path / "data")
    yield s
    assert s.stop() == 0


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


def test_errors_go_to_stderr_with_a_non_zero_exit(sidecar: Sidecar) -> None:
    t = ("--target", sidecar.unix_target)
    ckpt("put", "e", *t, stdin=b"\x08\x01")
    conflict = ckpt("put", "e", "--expected-version", "0", *t, stdin=b"\x08\x02")
    assert conflict.returncode == 1 and conflict.stdout == b""
    assert b"ckpt put: session 'e': expected_version 0 but the head is version 1" in conflict.stderr
    missing = ckpt("get", "nope", *t)
    assert missing.returncode == 1 and b"'nope' does not exist" in missing.stderr
    for label in ("novalue", "=v"):
        bad_label = ckpt("put", "e", "--label", label, *t, stdin=b"")
        assert bad_label.returncode == 2 and b"is not KEY=VALUE (a non-empty KEY)" in bad_label.stderr
    usage = ckpt("frobnicate")
    assert usage.returncode == 2 and b"invalid choice" in usage.stderr


def test_a_commands_options_may_come_before_between_or_after_its_arguments(sidecar: Sidecar, tmp_path: Path) -> None:
    """argparse alone took `ckpt put s --merge FILE` for a put from stdin and refused FILE."""
    t = ("--target", sidecar.unix_target)
    base, patch = tmp_path / "base.bin", tmp_path / "patch.bin"
    base.write_bytes(b"\x08\x01")
    patch.write_bytes(b"\x10\x02")
    orders = [
        ("put", "s", *t, str(base)),
        ("put", "s", "--merge", *t, str(patch)),
        ("put", *t, "s", "--merge", str(patch), "--expected-version", "2"),
        ("put", "--merge", "s", str(patch), *t),
    ]
    for version, args in enumerate(orders, start=1):
        out = ckpt(*args)
        assert out.returncode == 0 and f'"version": "{version}"'.encode() in out.stdout, (args, out.stderr)
    assert ckpt("get", "s", *t).stdout == b"\x08\x01" + b"\x10\x02" * 3
    assert ckpt("get", "s", "--version", "1", *t).stdout == ckpt("get", *t, "--version", "1", "s").stdout == b"\x08\x01"
    # verify's sessions around an option: both are checked (the second does not exist).
    both = ckpt("verify", "s", "--data-dir", str(sidecar.data_dir), "missing")
    assert both.returncode == 1 and b"verified 2 sessions: 1 ok, 1 failed" in both.stdout, both
    # A bad option is refused by the command, with its own usage.
    bad = ckpt("put", "s", "--bogus", *t, str(base))
    assert bad.returncode == 2 and b"usage: ckpt put" in bad.stderr and b"unrecognized arguments: --bogus" in bad.stderr
    missing = ckpt("get", *t)
    assert missing.returncode == 2
    assert b"ckpt get: error: the following arguments are required: session" in missing.stderr
    assert ckpt("history", "s", *t).stdout.count(b'"version"') == 4  # nothing else was written
    # After `--` every argument is positional: a session id that starts with a dash.
    assert ckpt("put", *t, "--", "-odd", str(base)).returncode == 0
    assert ckpt("put", "--merge", *t, "--", "-odd", str(patch)).returncode == 0
    assert ckpt("get", *t, "--", "-odd").stdout == b"\x08\x01\x10\x02"
    assert b'"version": "2"' in ckpt("history", *t, "--", "-odd").stdout
    assert ckpt("delete", *t, "--", "-odd").stdout.strip() == b'{"deleted_versions": 2}'


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("put", ""), b"SESSION is empty; it must be 1-256 bytes of UTF-8"),
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


def test_version_and_text_as_it_is(sidecar: Sidecar, tmp_path: Path) -> None:
    version = ckpt("--version")
    assert version.returncode == 0 and version.stdout.decode().startswith("ckpt 0."), version
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


def test_help_describes_every_command() -> None:
    top = ckpt("--help").stdout.decode()
    for command in ("serve", "put", "get", "history", "sessions", "fork", "delete", "inspect", "verify", "stats"):
        assert command in top
        assert ckpt(command, "--help").returncode == 0
    assert "CKPT_LISTEN" in ckpt("serve", "--help").stdout.decode()


def test_inspect_verify_and_stats_beside_a_running_sidecar(sidecar: Sidecar) -> None:
    t = ("--target", sidecar.unix_target)
    ckpt("put", "v", *t, stdin=b"\x2a\x80\x50" + b"agent notes " * 853 + b"....")  # a 10 KB goal
    for n in range(2, 8):
        ckpt("put", "v", "--merge", *t, stdin=b"\x0a\x40" + bytes([65 + n]) * 64)
    d = ("--data-dir", str(sidecar.data_dir))
    inspect = ckpt("inspect", "v", *d).stdout.decode()
    assert "versions 1..7" in inspect and "FULL" in inspect and "PATCH" in inspect
    # Each version's creation time, as history gives it (RFC 3339, UTC, to the nanosecond).
    created = [json.loads(line)["created_at"] for line in ckpt("history", "v", *t).stdout.decode().splitlines()]
    rows = [line.split() for line in inspect.splitlines()[2:]]
    assert [row[-1] for row in reversed(rows)] == created
    ok = ckpt("verify", *d)
    assert ok.returncode == 0 and b"verified 1 session: 1 ok, 0 failed" in ok.stdout
    stats = json.loads(ckpt("stats", *d).stdout)
    assert stats["sessions"] == 1 and stats["versions"] == 7
    # Only what the directory holds: the read-only opening's own counters (commits,
    # cache hits) would read 0 beside a busy sidecar.
    assert set(stats) == {"sessions", "versions", "map_size_bytes", "used_bytes", "data_mdb_bytes"}


def test_verify_names_a_corrupt_frame(tmp_path: Path) -> None:
    sidecar = start_sidecar(tmp_path / "data")
    for n in range(1, 5):
        ckpt("put", "bad", "--merge", "--target", sidecar.unix_target, stdin=b"\x0a\x40" + bytes([65 + n]) * 64)
    ckpt("put", "good", "--target", sidecar.unix_target, stdin=b"\x08\x01")
    assert sidecar.stop() == 0
    env = lmdb.open(str(tmp_path / "data" / "lmdb"), max_dbs=8)
    with env.begin(write=True) as txn:
        db = env.open_db(b"frames", txn=txn)
        key = b"bad\x00" + (3).to_bytes(8, "big")
        value = bytearray(txn.get(key, db=db) or b"")
        value[-2] ^= 0xFF
        txn.put(key, bytes(value), db=db)
    env.close()
    result = ckpt("verify", "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 1
    assert b"FAIL session 'bad': frame checksum mismatch for version 3" in result.stderr
    assert b"verified 2 sessions: 1 ok, 1 failed" in result.stdout


def test_serve_compacts_merge_states_of_the_type_it_is_told(tmp_path: Path) -> None:
    bad = ckpt("serve", "--data-dir", str(tmp_path / "bad"), "--merge-message-type", "no.such.Type")
    assert bad.returncode == 2 and b"--merge-message-type 'no.such.Type' is not a protobuf message type" in bad.stderr
    sidecar = start_sidecar(tmp_path / "data", "--merge-message-type", "ckpt.v1.Checkpoint")
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            merged = pb.Checkpoint()
            for v in range(1, 41):  # the same fields rewritten every step
                patch = pb.Checkpoint(step=v, goal=f"goal revision {v} " + "g" * 200)
                merged.MergeFrom(patch)
                client.merge("edits", patch.SerializeToString())
            state = client.get("edits").state
            assert pb.Checkpoint.FromString(state) == merged
            assert len(state) < 10 * patch.ByteSize()  # not 40 patches' worth
            with pytest.raises(InvalidArgumentError, match=r"does not parse as ckpt\.v1\.Checkpoint"):
                client.merge("edits", b"\x82\x01\x01\x08")
    finally:
        assert sidecar.stop() == 0


def test_serve_bounds_encoder_memory_by_its_flag(tmp_path: Path) -> None:
    bad = ckpt("serve", "--data-dir", str(tmp_path / "bad"), "--encoder-cache-bytes", "-1")
    assert bad.returncode == 2 and b"--encoder-cache-bytes must be >= 0, got -1" in bad.stderr
    port = free_port()
    # A budget no encoder fits: every write resumes its chain from LMDB, and still round-trips.
    sidecar = start_sidecar(tmp_path / "data", "--encoder-cache-bytes", "1", "--metrics-port", str(port))
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            states = [pb.Checkpoint(step=v, goal="g" * 2000 + str(v)).SerializeToString() for v in range(1, 6)]
            for s in states:
                client.put("bounded", s)
            assert [client.get("bounded", version=v).state for v in range(1, 6)] == states
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert 'ckpt_cache_bytes{cache="encoder_cache"} 0.0' in text
        assert 'ckpt_cache_bytes{cache="state_cache"} 0.0' not in text
    finally:
        assert sidecar.stop() == 0


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


def test_a_bad_environment_variable_is_named_not_a_traceback(tmp_path: Path) -> None:
    bad = ckpt("serve", "--data-dir", str(tmp_path / "d"), env={"CKPT_THREADS": "abc"})
    assert bad.returncode == 2 and b"Traceback" not in bad.stderr
    assert b"--threads: 'abc' is not an integer (from the option or CKPT_THREADS)" in bad.stderr
    durability = ckpt("serve", "--data-dir", str(tmp_path / "d"), env={"CKPT_DURABILITY": "fast"})
    assert durability.returncode == 2 and b"Traceback" not in durability.stderr
    assert b"'fast' is not one of sync, no-meta-sync (from the option or CKPT_DURABILITY)" in durability.stderr
    # Only the command that reads the variable fails; help always works.
    assert ckpt("serve", "--help", env={"CKPT_METRICS_PORT": "x"}).returncode == 0
    client = ckpt("get", "s", "--target", f"unix:{tmp_path / 'none.sock'}", env={"CKPT_THREADS": "abc"})
    assert client.returncode == 1 and b"Traceback" not in client.stderr and b"threads" not in client.stderr
    assert client.stderr.endswith(
        b"; is `ckpt serve` running there? (the address is --target, else the socket in --data-dir)\n"
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--max-message-bytes", "1000"), b"--max-message-bytes must be >= 131072"),
        # gRPC takes message sizes as C ints: this was an OverflowError traceback.
        (("--max-message-bytes", "3000000000"), b"--max-message-bytes must be <= 2147483647 (2 GiB - 1, gRPC's limit)"),
        (("--threads", "0"), b"--threads must be >= 1, got 0"),
        (("--max-map-size-bytes", "1000"), b"--max-map-size-bytes must be >= 1 MiB, got 1000"),
        (("--keep-last-versions", "0"), b"--keep-last-versions must be >= 1 (or left out), got 0"),
        (("--metrics-port", "70000"), b"--metrics-port must be in 0..65535"),
        (("--metrics-address", ""), b"--metrics-address must be an IP address or host name, got ''"),
        (("--heap-trim-interval-seconds", "-1"), b"--heap-trim-interval-seconds must be >= 0 (0 = never), got -1.0"),
        # Durations must fit a nanosecond time: inf and NaN made retention skip every session, or every
        # sweep fail, while the sidecar served on (found by helper-20).
        *(
            ((flag, value), f"{flag} must be at most 3153600000 seconds (100 years), got {shown}".encode())
            for flag in (
                "--max-version-age-seconds",
                "--keyframe-after-quiet-seconds",
                "--grace-seconds",
                "--heap-trim-interval-seconds",
            )
            for value, shown in (("inf", "inf"), ("4e9", "4000000000.0"))
        ),
        (("--max-version-age-seconds", "nan"), b"--max-version-age-seconds must be at most 3153600000 seconds"),
        (
            ("--keyframe-after-quiet-seconds", "nan"),
            b"--keyframe-after-quiet-seconds must be > 0 (or left out), got nan",
        ),
        (("--grace-seconds", "nan"), b"--grace-seconds must be at most 3153600000 seconds (100 years), got nan"),
        (("--heap-trim-interval-seconds", "nan"), b"--heap-trim-interval-seconds must be >= 0 (0 = never), got nan"),
    ],
)
def test_serve_configuration_errors_name_the_option(tmp_path: Path, flags: tuple[str, ...], message: bytes) -> None:
    out = ckpt("serve", "--data-dir", str(tmp_path / "d"), *flags)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert b"Traceback" not in out.stderr


def test_serve_accepts_a_map_cap_below_the_default_initial_map(tmp_path: Path) -> None:
    s = start_sidecar(tmp_path / "data", "--max-map-size-bytes", str(64 << 20))
    try:
        assert ckpt("put", "small", "--target", s.unix_target, stdin=b"\x08\x01").returncode == 0
    finally:
        assert s.stop() == 0


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


def test_bench_without_the_harness_says_so(tmp_path: Path) -> None:
    # The container image installs the sidecar without bench/'s harness; `ckpt bench` ended in a traceback there.
    script = (
        "import sys; sys.modules['ckpt.bench.harness'] = None;"
        " from ckpt.sidecar.cli.main import main; sys.exit(main(['bench']))"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, cwd=ROOT, timeout=60)
    assert out.returncode == 1 and b"Traceback" not in out.stderr
    assert out.stderr.startswith(b"ckpt bench: the benchmark harness is not installed here")


def test_a_bracketed_ipv6_metrics_address_is_taken_as_in_listen(tmp_path: Path) -> None:
    assert ServeConfig(data_dir=tmp_path, metrics_address="[::1]").metrics_address == "::1"
    assert ServeConfig(data_dir=tmp_path, metrics_address="::").metrics_address == "::"
