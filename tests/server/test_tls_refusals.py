"""TLS files and handshakes that fail: each refused by name, never by a passphrase prompt, and the command
line's message saying what the failure was. Real `ckpt serve` processes, certificates from test CAs (trustme)."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from cryptography.hazmat.primitives import serialization

from ckpt.sidecar.client import ENV_VARS, CheckpointClient, ClientTLS
from tests.support import Sidecar, start_sidecar


def _encrypted(key_pem: bytes) -> bytes:
    key = serialization.load_pem_private_key(key_pem, password=None)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret passphrase"),
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA; a server and a client certificate from it, each key also encrypted; an expired server certificate."""
    where = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("agent-1@example.test")
    long_ago = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
    expired = ca.issue_cert("127.0.0.1", not_before=long_ago, not_after=long_ago + datetime.timedelta(days=1))
    files = {name: where / name for name in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}
    files |= {name: where / name for name in ("server-enc.key", "client-enc.key", "expired.pem", "expired.key")}
    ca.cert_pem.write_to_path(str(files["ca.pem"]))
    for name, issued in (("server", server), ("client", client), ("expired", expired)):
        issued.cert_chain_pems[0].write_to_path(str(files[f"{name}.pem"]))
        issued.private_key_pem.write_to_path(str(files[f"{name}.key"]))
    files["server-enc.key"].write_bytes(_encrypted(server.private_key_pem.bytes()))
    files["client-enc.key"].write_bytes(_encrypted(client.private_key_pem.bytes()))
    return files


def _ckpt(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ckpt.sidecar.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if not k.startswith("CKPT_")} | env,
    )


def test_a_key_renewed_to_an_encrypted_one_is_refused_by_name_and_the_last_good_pair_serves(
    tmp_path: Path, pki: dict[str, Path]
) -> None:
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    cert.write_bytes(pki["server.pem"].read_bytes())
    key.write_bytes(pki["server.key"].read_bytes())
    s = start_sidecar(tmp_path / "data", "--tls-cert-file", str(cert), "--tls-key-file", str(key))
    trusted = ClientTLS.from_files(ca_file=pki["ca.pem"])
    try:
        with CheckpointClient(s.tcp_target, tls=trusted, own_connection=True) as c:
            c.put("r", b"before")
        key.write_bytes(pki["server-enc.key"].read_bytes())
        for _ in range(2):  # each a new handshake, after the key changed
            with CheckpointClient(s.tcp_target, tls=trusted, own_connection=True, timeout_seconds=10) as c:
                assert c.get("r").state == b"before"
        log = s.log()
        assert f"tls_key_file '{key}' is encrypted (it needs a passphrase; ckpt takes unencrypted keys)" in log
        assert "still serving the previous ones" in log
        assert "Traceback" not in log and "pass phrase" not in log
    finally:
        assert s.stop() == 0


def test_serve_refuses_an_encrypted_key_naming_the_option(tmp_path: Path, pki: dict[str, Path]) -> None:
    done = _ckpt(
        "serve",
        "--data-dir",
        str(tmp_path / "d"),
        "--listen",
        "127.0.0.1:0",
        "--tls-cert-file",
        str(pki["server.pem"]),
        "--tls-key-file",
        str(pki["server-enc.key"]),
    )
    assert done.returncode == 2, done.stderr
    assert f"--tls-key-file '{pki['server-enc.key']}' is encrypted" in done.stderr
    assert "pass phrase" not in done.stderr + done.stdout


def test_clients_refuse_an_encrypted_client_key_naming_the_option_or_variable(
    pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    tls = ["--tls-ca-file", str(pki["ca.pem"]), "--tls-client-cert-file", str(pki["client.pem"])]
    done = _ckpt("sessions", "--target", "127.0.0.1:1", *tls, "--tls-client-key-file", str(pki["client-enc.key"]))
    assert done.returncode == 2, done.stderr
    assert f"--tls-client-key-file '{pki['client-enc.key']}' is encrypted" in done.stderr
    assert "pass phrase" not in done.stderr
    for var in ENV_VARS.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CKPT_TARGET", "127.0.0.1:1")
    monkeypatch.setenv("CKPT_TLS_CA_FILE", str(pki["ca.pem"]))
    monkeypatch.setenv("CKPT_TLS_CLIENT_CERT_FILE", str(pki["client.pem"]))
    monkeypatch.setenv("CKPT_TLS_CLIENT_KEY_FILE", str(pki["client-enc.key"]))
    with pytest.raises(ValueError, match=r"CKPT_TLS_CLIENT_KEY_FILE '.*client-enc.key' is encrypted"):
        CheckpointClient.from_env()


def test_a_server_name_without_a_ca_is_refused_by_the_environment_as_by_the_command_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    done = _ckpt("sessions", CKPT_TARGET="127.0.0.1:1", CKPT_TLS_SERVER_NAME="ckpt.example.test")
    assert done.returncode == 2
    assert "--tls-server-name (from CKPT_TLS_SERVER_NAME) needs --tls-ca-file" in done.stderr
    for var in ENV_VARS.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CKPT_TARGET", "127.0.0.1:1")
    monkeypatch.setenv("CKPT_TLS_SERVER_NAME", "ckpt.example.test")
    with pytest.raises(ValueError, match="CKPT_TLS_SERVER_NAME needs CKPT_TLS_CA_FILE"):
        CheckpointClient.from_env()


@pytest.fixture(scope="module")
def sidecars(tmp_path_factory: pytest.TempPathFactory, pki: dict[str, Path]) -> Iterator[dict[str, Sidecar]]:
    """A plaintext sidecar, one with an expired certificate, one asking for client certificates (mutual TLS)."""
    where = tmp_path_factory.mktemp("sidecars")
    serving = {
        "plaintext": start_sidecar(where / "plaintext"),
        "expired": start_sidecar(
            where / "expired", "--tls-cert-file", str(pki["expired.pem"]), "--tls-key-file", str(pki["expired.key"])
        ),
        "mutual": start_sidecar(
            where / "mutual",
            *("--tls-cert-file", str(pki["server.pem"]), "--tls-key-file", str(pki["server.key"])),
            *("--tls-client-ca-file", str(pki["ca.pem"])),
        ),
    }
    yield serving
    for s in serving.values():
        assert s.stop() == 0


def test_the_command_line_says_which_tls_handshake_failure_it_met(
    sidecars: dict[str, Sidecar], pki: dict[str, Path]
) -> None:
    ca = ["--tls-ca-file", str(pki["ca.pem"])]

    def failure(sidecar: str, *tls: str) -> str:
        done = _ckpt("get", "s", "--target", sidecars[sidecar].tcp_target, *tls)
        assert done.returncode == 1, done.stderr
        last = done.stderr.strip().splitlines()[-1]  # after gRPC's own log lines
        assert "is `ckpt serve` running there?" not in last
        return last

    assert "the sidecar there serves plaintext: drop the --tls-* options" in failure("plaintext", *ca)
    named = failure("mutual", *ca, "--tls-server-name", "ckpt.example.test")
    assert "its certificate does not name that host (--tls-server-name" in named
    assert "mutual TLS" not in named
    assert "certificate was refused (is --tls-ca-file the CA that signed it?)" in failure("expired", *ca)
    stranger = ["--tls-client-cert-file", str(pki["expired.pem"]), "--tls-client-key-file", str(pki["expired.key"])]
    refused = failure("mutual", *ca, *stranger)  # a client certificate out of its dates: the sidecar closes
    assert "check that --tls-client-cert-file is signed by that CA and not expired" in refused
    assert "give --tls-client-cert-file and --tls-client-key-file" in failure("mutual", *ca)
