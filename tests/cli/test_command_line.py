"""What every `ckpt` command does alike: exit statuses and stderr, options anywhere, help, version, `ckpt bench`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support import ROOT, Sidecar, ckpt


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


def test_help_describes_every_command() -> None:
    top = ckpt("--help").stdout.decode()
    for command in ("serve", "put", "get", "history", "sessions", "fork", "delete", "inspect", "verify", "stats"):
        assert command in top
        assert ckpt(command, "--help").returncode == 0
    assert "CKPT_LISTEN" in ckpt("serve", "--help").stdout.decode()


def test_version_is_the_installed_one() -> None:
    version = ckpt("--version")
    assert version.returncode == 0 and version.stdout.decode().startswith("ckpt 0."), version


def test_bench_without_the_harness_says_so(tmp_path: Path) -> None:
    # An install without the bench extra's packages: `ckpt bench` ended in a traceback there.
    script = (
        "import sys; sys.modules['ckpt.bench.harness'] = None; from ckpt.command import main; sys.exit(main(['bench']))"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, cwd=ROOT, timeout=60)
    assert out.returncode == 1 and b"Traceback" not in out.stderr
    assert out.stderr.startswith(b"ckpt bench: the benchmark harness is not installed here")
