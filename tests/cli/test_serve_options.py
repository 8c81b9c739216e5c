"""`ckpt serve`'s options at work: what they set, and how a bad one (flag or CKPT_* variable) is refused."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from ckpt.sidecar.client import CheckpointClient, InvalidArgumentError
from ckpt.sidecar.config import ServeConfig
from ckpt.v1 import checkpoint_pb2 as pb
from tests.support import ckpt, free_port, start_sidecar


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


def test_a_bad_environment_variable_is_named_not_a_traceback(tmp_path: Path) -> None:
    bad = ckpt("serve", "--data-dir", str(tmp_path / "d"), env={"CKPT_THREADS": "abc"})
    assert bad.returncode == 2 and b"Traceback" not in bad.stderr
    assert b"--threads: 'abc' is not an integer (from the option or CKPT_THREADS)" in bad.stderr
    # int() and float() read these as 10 and 51308: as typed, they are not the numbers they look like.
    for name, value in [("CKPT_THREADS", "1_0"), ("CKPT_METRICS_PORT", "\u0665\u0661\u0663\u0660\u0668")]:
        odd = ckpt("serve", "--data-dir", str(tmp_path / "d"), env={name: value})
        assert odd.returncode == 2 and f"{value!r} is not an integer".encode() in odd.stderr, odd.stderr
    for flag in ("--sweep-interval-seconds", "--workers"):
        odd = ckpt("serve", "--data-dir", str(tmp_path / "d"), flag, " 1_0")
        assert odd.returncode == 2 and b"' 1_0' is not a" in odd.stderr, odd.stderr
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
        # A port past 65535 was bound modulo 65536, or (--workers 2) an OverflowError traceback.
        (("--listen", "127.0.0.1:99999"), b"--listen port must be in 0..65535, got '127.0.0.1:99999'"),
        (("--listen", "127.0.0.1:99999", "--workers", "2"), b"--listen port must be in 0..65535"),
        (("--listen", "[::1]:65536"), b"--listen port must be in 0..65535, got '[::1]:65536'"),
        # int() takes these, and gRPC bound a negative port modulo 65536 (-15536: 50000, -1: 65535).
        *(
            (("--listen", address), f"--listen port must be in 0..65535, got '{address}'".encode())
            for address in ("127.0.0.1:-15536", "127.0.0.1:-1", "127.0.0.1:+50998", "127.0.0.1: 50997", "[::1]:5e4")
        ),
        (("--listen", "127.0.0.1:-1", "--workers", "2"), b"--listen port must be in 0..65535"),
        (("--listen", ":50997"), b"--listen address needs a host (0.0.0.0 or [::] for every address), got ':50997'"),
        # gRPC bound this on port 443.
        (("--listen", "localhost"), b"--listen address must be unix:/path or host:port, got 'localhost'"),
        # gRPC took it as the working directory: "cannot listen on unix:.: it exists and is not a socket", exit 1.
        (("--listen", "unix:"), b"--listen address 'unix:' names no socket: give unix:/path or unix-abstract:name"),
        (("--listen", "::1:50051"), b"--listen IPv6 address must be in brackets, as [::1]:50051, got '::1:50051'"),
        # Worker 1 would serve /metrics on 65536: its store process crashed.
        (
            ("--listen", "127.0.0.1:50051", "--workers", "2", "--metrics-port", "65535"),
            b"--metrics-port must be at most 65534 with --workers 2 (worker i serves /metrics on --metrics-port + i,"
            b" at most 65535), got 65535",
        ),
        # The sidecar bound /metrics first, then failed to listen: "127.0.0.1:50051 is in use (another
        # process listens there)", exit 1.
        (
            ("--listen", "127.0.0.1:50051", "--metrics-port", "50051"),
            b"--metrics-port 50051 takes the port of --listen address '127.0.0.1:50051': give /metrics a port of its"
            b" own",
        ),
        (
            ("--listen", "127.0.0.1:50052", "--workers", "2", "--metrics-port", "50051"),
            b"--metrics-port 50051 (with --workers 2: 50051..50052) takes the port of --listen address"
            b" '127.0.0.1:50052'",
        ),
        (("--metrics-address", ""), b"--metrics-address must be an IP address or host name, got ''"),
        (("--heap-trim-interval-seconds", "-1"), b"--heap-trim-interval-seconds must be >= 0 (0 = never), got -1.0"),
        # Durations must fit a nanosecond time: inf and NaN made retention skip every session, or every
        # sweep fail, while the sidecar served on.
        *(
            ((flag, value), f"{flag} must be at most 3153600000 seconds (100 years), got {shown}".encode())
            for flag in (
                "--max-version-age-seconds",
                "--keyframe-after-quiet-seconds",
                "--grace-seconds",
                "--heap-trim-interval-seconds",
            )
            for value, shown in (("4e9", "4000000000.0"),)
        ),
        *(
            ((flag, value), f"{flag} must be a finite number of seconds, got {value}".encode())
            for flag in (
                "--max-version-age-seconds",
                "--max-event-age-seconds",
                "--keyframe-after-quiet-seconds",
                "--request-id-ttl-seconds",
                "--sweep-interval-seconds",
                "--max-commit-delay-seconds",
                "--grace-seconds",
                "--heap-trim-interval-seconds",
            )
            for value in ("nan", "inf")
        ),
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


def test_a_bracketed_ipv6_metrics_address_is_taken_as_in_listen(tmp_path: Path) -> None:
    assert ServeConfig(data_dir=tmp_path, metrics_address="[::1]").metrics_address == "::1"
    assert ServeConfig(data_dir=tmp_path, metrics_address="::").metrics_address == "::"


@pytest.mark.parametrize(
    ("env", "flags", "message"),
    [
        ({"CKPT_THREADS": "0"}, (), b"--threads (from CKPT_THREADS) must be >= 1, got 0"),
        ({"CKPT_CACHE_SIZE_BYTES": "-1"}, (), b"--cache-size-bytes (from CKPT_CACHE_SIZE_BYTES) must be >= 0, got -1"),
        (
            {"CKPT_MAX_MESSAGE_BYTES": "10"},
            (),
            b"--max-message-bytes (from CKPT_MAX_MESSAGE_BYTES) must be >= 131072 (twice the 65536-byte envelope",
        ),
        (
            {"CKPT_KEEP_LAST_VERSIONS": "0"},
            (),
            b"--keep-last-versions (from CKPT_KEEP_LAST_VERSIONS) must be >= 1 (or left out), got 0",
        ),
        (
            {"CKPT_LISTEN": "127.0.0.1:99999"},
            (),
            b"--listen (from CKPT_LISTEN) port must be in 0..65535, got '127.0.0.1:99999'",
        ),
        (
            {"CKPT_LISTEN": "unix:x.sock,127.0.0.1:-1"},
            (),
            b"--listen (from CKPT_LISTEN) port must be in 0..65535, got '127.0.0.1:-1'",
        ),
        # One value from a variable, one from the command line: each named by where it came from.
        (
            {"CKPT_WORKERS": "2"},
            ("--listen", "127.0.0.1:50051", "--metrics-port", "65535"),
            b"--metrics-port must be at most 65534 with --workers (from CKPT_WORKERS) 2",
        ),
        (
            {"CKPT_TLS_CERT_FILE": "cert.pem"},
            ("--listen", "127.0.0.1:0"),
            b"--tls-cert-file (from CKPT_TLS_CERT_FILE) and --tls-key-file go together",
        ),
        # The option wins over its variable, and is what the error names.
        ({"CKPT_THREADS": "4"}, ("--threads", "0"), b"ckpt serve: --threads must be >= 1, got 0\n"),
        ({"CKPT_LISTEN": "unix:x.sock"}, ("--listen", "127.0.0.1:99999"), b"ckpt serve: --listen port must be"),
    ],
)
def test_serve_configuration_errors_name_the_variable_a_value_came_from(
    tmp_path: Path, env: dict[str, str], flags: tuple[str, ...], message: bytes
) -> None:
    out = ckpt("serve", "--data-dir", str(tmp_path / "d"), *flags, env=env)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert b"Traceback" not in out.stderr
