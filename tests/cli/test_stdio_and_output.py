"""The command line's output written whole or failed, its stdio closed or interrupted, and what it prints."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from ckpt.sidecar.client import CheckpointClient, event
from tests.support import ROOT, Sidecar, ckpt

CLI = [sys.executable, "-m", "ckpt.sidecar.cli"]
#: The largest file the command may write (RLIMIT_FSIZE): a write past it takes the bytes below the
#: limit and returns that short count, the next one fails with EFBIG (Python ignores SIGXFSZ), as on a
#: disk that fills up.
FILE_LIMIT = 100_000


def _file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))


def run(
    *args: str, stdout: int | IO[Any] = subprocess.PIPE, preexec_fn: Callable[[], None] | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*CLI, *args],
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        timeout=60,
        preexec_fn=preexec_fn,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )


def test_get_and_blob_get_fail_naming_the_output_when_it_cannot_take_every_byte(
    sidecar: Sidecar, tmp_path: Path
) -> None:
    t = ("--target", sidecar.unix_target)
    state, blob = os.urandom(1_500_000), os.urandom(900_000)  # the blob: one chunk
    with CheckpointClient(sidecar.unix_target) as c:
        c.put("big", state)
        sha = c.put_blob(blob, session_id="big").content_hash
    for command in (("get", "big"), ("blob", "get", sha)):
        out = tmp_path / "out.bin"
        with open(out, "wb") as f:
            done = run(*command, *t, stdout=f, preexec_fn=_file_limit)
        assert done.returncode == 1, (command, done.stderr)
        assert done.stderr.startswith(f"ckpt {command[0]}: cannot write stdout: File too large".encode()), done.stderr
        assert out.stat().st_size <= FILE_LIMIT
        named = tmp_path / "named.bin"
        done = run(*command, *t, "--out", str(named), preexec_fn=_file_limit)
        assert done.returncode == 1 and f"cannot write {str(named)!r}: File too large".encode() in done.stderr
        assert not named.exists() and not Path(f"{named}.partial").exists()  # whole, or not there


def test_ctrl_c_during_blob_put_from_an_idle_stdin_exits_130_and_stores_nothing(sidecar: Sidecar) -> None:
    t = ("--target", sidecar.unix_target)
    with subprocess.Popen(
        [*CLI, "blob", "put", "idle", "-", *t],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    ) as put:
        assert put.stdin is not None
        put.stdin.write(os.urandom(3_000_000))  # returns once all but a pipe's worth is read; stdin stays open
        put.stdin.flush()
        time.sleep(1)  # the read waits for more
        put.send_signal(signal.SIGINT)
        put.wait(timeout=30)  # stdin still open (communicate() would close it first)
        assert put.stderr is not None
        err = put.stderr.read()
    assert put.returncode == 130, err.decode()
    assert b"Fatal Python error" not in err
    listed = ckpt("sessions", *t)
    assert listed.returncode == 0 and listed.stdout == b""  # no blob, so no session referencing one


def test_a_closed_stdin_or_stdout_is_an_error_said_on_stderr(sidecar: Sidecar, tmp_path: Path) -> None:
    t = ("--target", sidecar.unix_target)
    with CheckpointClient(sidecar.unix_target) as c:
        c.put("s", b"state")

    def closed(fd: int) -> Callable[[], None]:
        return lambda: os.close(fd)

    for command, fd, said in (
        (("put", "s"), 0, b"ckpt put: no FILE given and stdin is closed: name a FILE, or pipe the state in\n"),
        (("blob", "put", "s", "-"), 0, b"ckpt blob: FILE is - and stdin is closed: name a FILE, or pipe the blob in\n"),
        (("get", "s"), 1, b"ckpt get: stdout is closed and the command prints to it: redirect it (to /dev/null"),
        (("history", "s"), 1, b"ckpt history: stdout is closed and the command prints to it"),
    ):
        done = run(*command, *t, preexec_fn=closed(fd))
        assert done.returncode == 1 and done.stderr.startswith(said), (command, done.stderr)
    out = tmp_path / "state.bin"
    to_file = run("get", "s", "--out", str(out), *t, preexec_fn=closed(1))  # prints nothing to stdout
    assert to_file.returncode == 0 and out.read_bytes() == b"state"
    assert [json.loads(line)["version"] for line in ckpt("history", "s", *t).stdout.splitlines()] == ["1"]


def test_a_poll_interval_that_is_not_finite_or_past_a_day_is_a_bad_command_line(sidecar: Sidecar) -> None:
    t = ("--target", sidecar.unix_target)
    with CheckpointClient(sidecar.unix_target) as c:
        c.append_events("e", [event("tool")])
    for seconds in ("inf", "1e12", "nan", "0", "86400.5"):
        done = subprocess.run(
            [*CLI, "events", "e", "--follow", "--poll-seconds", seconds, *t], capture_output=True, cwd=ROOT, timeout=5
        )
        assert done.returncode == 2, (seconds, done.stderr)
        said = f"argument --poll-seconds: must be > 0 and at most 86400 (a day), got {seconds!r}"
        assert said.encode() in done.stderr
        assert done.stdout == b""  # refused before reading
    assert ckpt("events", "e", "--poll-seconds", "86400", *t).returncode == 0


def test_option_errors_quote_the_paths_given_as_typed(tmp_path: Path) -> None:
    odd = tmp_path / "target" / "session" / "threads" / "version.pem"
    get = ckpt("get", "s", "--target", "127.0.0.1:1", "--tls-ca-file", str(odd))
    assert get.returncode == 2
    assert get.stderr == f"ckpt get: --tls-ca-file {str(odd)!r} cannot be read: No such file or directory\n".encode()
    serve = ckpt(
        "serve", "--data-dir", str(tmp_path / "d"), "--listen", "127.0.0.1:0",
        "--tls-cert-file", str(odd), "--tls-key-file", str(odd),
    )  # fmt: skip
    assert serve.returncode == 2
    assert f"ckpt serve: --tls-cert-file {str(odd)!r} cannot be read".encode() in serve.stderr


def test_json_output_shows_empty_and_zero_fields(sidecar: Sidecar) -> None:
    t = ("--target", sidecar.unix_target)
    empty = ckpt("blob", "put", "s", "-", *t)
    sha = hashlib.sha256(b"").hexdigest()
    assert json.loads(empty.stdout) == {
        "uri": f"ckpt-blob:sha256:{sha}",
        "content_hash": f"sha256:{sha}",
        "size_bytes": "0",
        "media_type": "",
    }
    put = json.loads(ckpt("put", "p", *t).stdout)
    assert put["state_size"] == "0" and put["replayed"] is False
    history = [json.loads(line) for line in ckpt("history", "p", *t).stdout.splitlines()]
    assert history[0]["state_size"] == "0" and history[0]["parent_version"] == "0" and "state" not in history[0]
    with CheckpointClient(sidecar.unix_target) as c:
        c.append_events("only-events", [event("ping")])
    [listed] = [json.loads(line) for line in ckpt("sessions", *t).stdout.splitlines() if b"only-events" in line]
    assert listed["head_version"] == "0" and listed["labels"] == {}
    [ping] = [json.loads(line) for line in ckpt("events", "only-events", *t).stdout.splitlines()]
    assert ping["payload"] == "" and ping["attributes"] == {} and ping["type"] == "ping"


def test_get_out_writes_through_a_symlink_and_into_a_named_pipe_in_place(sidecar: Sidecar, tmp_path: Path) -> None:
    """--out is written whole through a rename only for a regular file: a rename over a named pipe or a device
    (`--out /dev/null`) would replace it with a file (as root) or fail; a symlink keeps pointing at its file."""
    t = ("--target", sidecar.unix_target)
    state = os.urandom(300_000)
    with CheckpointClient(sidecar.unix_target) as c:
        c.put("s", state)
        sha = c.put_blob(state, session_id="s").content_hash
    for command in (("get", "s"), ("blob", "get", sha)):
        real, link = tmp_path / "real.bin", tmp_path / "link.bin"
        real.write_bytes(b"old")
        link.unlink(missing_ok=True)
        link.symlink_to(real)
        done = run(*command, *t, "--out", str(link))
        assert done.returncode == 0, done.stderr
        assert link.is_symlink() and real.read_bytes() == state, command
        fifo = tmp_path / "pipe"
        fifo.unlink(missing_ok=True)
        os.mkfifo(fifo)
        got: list[bytes] = []
        reader = threading.Thread(target=lambda pipe=fifo, into=got: into.append(pipe.read_bytes()))
        reader.start()
        done = run(*command, *t, "--out", str(fifo))
        reader.join(timeout=30)
        assert done.returncode == 0, done.stderr
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode), f"{command}: the named pipe was replaced by a file"
        assert got == [state], command
        assert not list(tmp_path.glob("*.partial"))
