"""TLS on the sidecar's host:port listeners: a real `ckpt serve` with certificates from a test CA (trustme)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from ckpt.sidecar.client import ENV_VARS, AsyncCheckpointClient, CheckpointClient, ClientTLS, UnavailableError
from ckpt.sidecar.config import ServeConfig
from ckpt.sidecar.server.listening import reachable_from_other_hosts
from ckpt.sidecar.server.process import start_sidecar_process, wait_until_serving
from ckpt.v1 import service_pb2
from tests.client.test_node_client import node_command
from tests.support import Sidecar, free_port, start_sidecar


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA; the sidecar's certificate (127.0.0.1 and localhost) and a client's, both from it; a stranger CA."""
    where = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("agent-1@example.test")
    files = {
        "ca": where / "ca.pem",
        "server_cert": where / "server.pem",
        "server_key": where / "server.key",
        "client_cert": where / "client.pem",
        "client_key": where / "client.key",
        "other_ca": where / "other-ca.pem",
    }
    ca.cert_pem.write_to_path(str(files["ca"]))
    server.private_key_pem.write_to_path(str(files["server_key"]))
    server.cert_chain_pems[0].write_to_path(str(files["server_cert"]))
    client.private_key_pem.write_to_path(str(files["client_key"]))
    client.cert_chain_pems[0].write_to_path(str(files["client_cert"]))
    trustme.CA().cert_pem.write_to_path(str(files["other_ca"]))
    return files


def _tls_args(pki: dict[str, Path], *, mutual: bool = False) -> list[str]:
    """``ckpt serve``'s options for the test CA's server certificate, and with ``mutual`` its client CA."""
    args = ["--tls-cert-file", str(pki["server_cert"]), "--tls-key-file", str(pki["server_key"])]
    return [*args, "--tls-client-ca-file", str(pki["ca"])] if mutual else args


@pytest.fixture(scope="module")
def tls_sidecar(tmp_path_factory: pytest.TempPathFactory, pki: dict[str, Path]) -> Iterator[Sidecar]:
    s = start_sidecar(tmp_path_factory.mktemp("tls") / "data", *_tls_args(pki))
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def mtls_sidecar(tmp_path_factory: pytest.TempPathFactory, pki: dict[str, Path]) -> Iterator[Sidecar]:
    s = start_sidecar(tmp_path_factory.mktemp("mtls") / "data", *_tls_args(pki, mutual=True))
    yield s
    assert s.stop() == 0


def _refused(target: str, tls: ClientTLS | bool) -> str:
    with (
        CheckpointClient(target, tls=tls, timeout_seconds=3, retries=1) as c,
        pytest.raises(UnavailableError) as failed,
    ):
        c.get("s")
    return str(failed.value)


def test_a_tls_listener_serves_clients_that_trust_its_ca_and_no_one_in_plaintext(
    tls_sidecar: Sidecar, pki: dict[str, Path]
) -> None:
    assert "tls=on" in tls_sidecar.log()
    trusted = ClientTLS.from_files(ca_file=pki["ca"])
    with CheckpointClient(tls_sidecar.tcp_target, tls=trusted) as c:
        assert c.put("s", b"over tls").version == 1
        assert c.get("s").state == b"over tls"
        assert c.append_events("s", [service_pb2.Event(type="t", payload=b"event")]).last_seq == 1
        assert [e.payload for e in c.events("s")] == [b"event"]
    wait_until_serving(tls_sidecar.tcp_target, 5, tls=trusted)
    # Plaintext to the TLS port, and TLS trusting another CA: no call gets through.
    _refused(tls_sidecar.tcp_target, False)
    assert "CERTIFICATE_VERIFY_FAILED" in _refused(
        tls_sidecar.tcp_target, ClientTLS.from_files(ca_file=pki["other_ca"])
    )
    # The unix socket beside it stays plaintext, and sees the write made over TLS.
    with CheckpointClient(tls_sidecar.unix_target) as c:
        assert c.get("s").state == b"over tls"


def test_the_certificate_is_checked_against_the_name_connected_to(tls_sidecar: Sidecar, pki: dict[str, Path]) -> None:
    # The certificate names 127.0.0.1 and localhost: another name is refused unless the client says which to expect.
    assert "Hostname Verification Check failed" in _refused(
        tls_sidecar.tcp_target, ClientTLS.from_files(ca_file=pki["ca"], server_name="ckpt.example.test")
    )
    port = tls_sidecar.tcp_target.rpartition(":")[2]
    with CheckpointClient(f"localhost:{port}", tls=ClientTLS.from_files(ca_file=pki["ca"])) as c:
        assert c.get("s").state == b"over tls"
    with CheckpointClient(
        tls_sidecar.tcp_target, tls=ClientTLS.from_files(ca_file=pki["ca"], server_name="localhost")
    ) as c:
        assert c.get("s").state == b"over tls"


def test_mutual_tls_takes_only_clients_with_a_certificate_from_its_ca(
    mtls_sidecar: Sidecar, pki: dict[str, Path]
) -> None:
    assert "tls=mutual" in mtls_sidecar.log()
    _refused(mtls_sidecar.tcp_target, ClientTLS.from_files(ca_file=pki["ca"]))  # no client certificate
    # A client certificate from a CA the sidecar does not trust.
    stranger = trustme.CA().issue_cert("stranger@example.test")
    foreign = ClientTLS(
        root_certificates=pki["ca"].read_bytes(),
        client_certificate_chain=stranger.cert_chain_pems[0].bytes(),
        client_private_key=stranger.private_key_pem.bytes(),
    )
    _refused(mtls_sidecar.tcp_target, foreign)
    agent = ClientTLS.from_files(ca_file=pki["ca"], cert_file=pki["client_cert"], key_file=pki["client_key"])

    async def write_and_read() -> bytes:
        async with AsyncCheckpointClient(mtls_sidecar.tcp_target, tls=agent) as c:
            await c.put("m", b"mutual")
            return (await c.get("m")).state

    assert asyncio.run(write_and_read()) == b"mutual"


def test_the_command_line_connects_with_tls(tls_sidecar: Sidecar, pki: dict[str, Path], tmp_path: Path) -> None:
    def ckpt(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ckpt.sidecar.cli", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={k: v for k, v in os.environ.items() if not k.startswith("CKPT_")} | env,
        )

    done = ckpt("get", "s", "--target", tls_sidecar.tcp_target, "--tls-ca-file", str(pki["ca"]))
    assert (done.returncode, done.stdout) == (0, "over tls"), done.stderr
    done = ckpt("get", "s", CKPT_TARGET=tls_sidecar.tcp_target, CKPT_TLS_CA_FILE=str(pki["ca"]))
    assert (done.returncode, done.stdout) == (0, "over tls"), done.stderr
    done = ckpt("get", "s", "--target", tls_sidecar.tcp_target, "--tls-ca-file", str(tmp_path / "missing.pem"))
    assert done.returncode == 2
    assert f"--tls-ca-file '{tmp_path / 'missing.pem'}' cannot be read: No such file or directory" in done.stderr
    done = ckpt("get", "s", "--target", tls_sidecar.tcp_target)  # plaintext to the TLS port
    assert done.returncode == 1
    assert "if it serves TLS, give --tls-ca-file" in done.stderr
    done = ckpt("get", "s", "--target", tls_sidecar.unix_target, "--tls-ca-file", str(pki["ca"]))
    assert done.returncode == 2
    assert "is a unix socket, which the sidecar serves without TLS" in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tls-cert-file", "{server_cert}"], "--tls-cert-file and --tls-key-file go together"),
        (["--tls-client-ca-file", "{ca}"], "--tls-client-ca-file needs --tls-cert-file and --tls-key-file"),
        (
            ["--tls-cert-file", "{server_cert}", "--tls-key-file", "{client_key}"],
            "are not a PEM certificate chain and its private key",  # a key that is not the certificate's
        ),
        (["--tls-cert-file", "{server_cert}", "--tls-key-file", "{missing}"], "--tls-key-file '{missing}' cannot be"),
        (
            ["--tls-cert-file", "{server_cert}", "--tls-key-file", "{server_key}", "--tls-client-ca-file", "{not_pem}"],
            "--tls-client-ca-file '{not_pem}' is not a PEM file",
        ),
    ],
)
def test_serve_refuses_a_tls_configuration_it_cannot_use_naming_the_option(
    args: list[str], message: str, pki: dict[str, Path], tmp_path: Path
) -> None:
    (tmp_path / "not.pem").write_text("hello")
    names = {k: str(v) for k, v in pki.items()} | {
        "missing": str(tmp_path / "missing.pem"),
        "not_pem": str(tmp_path / "not.pem"),
    }
    argv = [a.format(**names) for a in args]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ckpt.sidecar.cli",
            "serve",
            "--data-dir",
            str(tmp_path / "d"),
            "--listen",
            "127.0.0.1:0",
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert message.format(**names) in done.stderr
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").iterdir())  # refused before opening the store


def test_tls_with_only_unix_sockets_is_refused(pki: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="every listen address is a unix socket, which is served without TLS"):
        ServeConfig(data_dir=tmp_path, tls_cert_file=pki["server_cert"], tls_key_file=pki["server_key"])


def test_client_tls_misuse() -> None:
    with pytest.raises(TypeError, match="tls must be a ClientTLS, True or False, not str"):
        CheckpointClient("127.0.0.1:1", tls="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="client_certificate_chain and client_private_key go together"):
        ClientTLS(client_certificate_chain=b"-----BEGIN CERTIFICATE-----")
    with pytest.raises(TypeError, match="root_certificates must be PEM bytes or None, not str"):
        ClientTLS(root_certificates="-----BEGIN")  # type: ignore[arg-type]


_NODE_TLS = """
const fs = require('fs');
const { CheckpointClient } = require(process.argv[1]);
const [target, ca, cert, key] = process.argv.slice(2);
const client = new CheckpointClient(target, {
  timeoutMs: 20000,
  tls: { rootCerts: fs.readFileSync(ca), certChain: fs.readFileSync(cert), privateKey: fs.readFileSync(key) },
});
(async () => {
  const put = await client.put('node-tls', Buffer.from('from node'));
  const got = await client.get('node-tls');
  console.log(JSON.stringify({ version: put.version, state: got.state.toString() }));
})().finally(() => client.close());
"""


def test_the_node_client_speaks_mutual_tls(mtls_sidecar: Sidecar, pki: dict[str, Path]) -> None:
    done = subprocess.run(
        node_command(
            _NODE_TLS, mtls_sidecar.tcp_target, str(pki["ca"]), str(pki["client_cert"]), str(pki["client_key"])
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"version": 1, "state": "from node"}


def test_a_renewed_certificate_serves_new_connections_without_a_restart(tmp_path: Path) -> None:
    old_ca, new_ca = trustme.CA(), trustme.CA()
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"

    def install(ca: trustme.CA) -> ClientTLS:
        issued = ca.issue_cert("127.0.0.1")
        issued.cert_chain_pems[0].write_to_path(str(cert))
        issued.private_key_pem.write_to_path(str(key))
        return ClientTLS(root_certificates=ca.cert_pem.bytes())

    trusts_old = install(old_ca)
    s = start_sidecar(tmp_path / "data", "--tls-cert-file", str(cert), "--tls-key-file", str(key))
    try:
        with CheckpointClient(s.tcp_target, tls=trusts_old, own_connection=True) as c:
            c.put("r", b"before")
        trusts_new = install(new_ca)
        # Each client its own connection: a new handshake, which takes the files as they are now.
        with CheckpointClient(s.tcp_target, tls=trusts_new, own_connection=True) as c:
            assert c.get("r").state == b"before"
        assert "CERTIFICATE_VERIFY_FAILED" in _refused(s.tcp_target, trusts_old)
        assert "TLS files changed: new connections get the certificate now" in s.log()
        key.write_text("-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")  # a broken renewal
        with CheckpointClient(s.tcp_target, tls=trusts_new, own_connection=True) as c:
            assert c.get("r").state == b"before"  # still served, with the last good certificate
        assert "TLS files changed but do not load; still serving the previous ones" in s.log()
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize(
    ("address", "exposed"),
    [
        ("127.0.0.1:50051", False),
        ("[::1]:50051", False),
        ("localhost:50051", False),
        ("unix:/run/ckpt/ckpt.sock", False),
        ("0.0.0.0:50051", True),
        ("[::]:50051", True),
        ("10.1.2.3:50051", True),
    ],
)
def test_which_listen_addresses_count_as_reachable_from_other_hosts(address: str, exposed: bool) -> None:
    assert reachable_from_other_hosts(address) is exposed


def test_plaintext_beyond_loopback_is_warned_about_and_tls_is_not(tmp_path: Path, pki: dict[str, Path]) -> None:
    port = free_port()
    plain = start_sidecar_process(tmp_path / "plain", listen=[f"unix:{tmp_path / 'p.sock'}", f"0.0.0.0:{port}"])
    try:
        assert f"serving plaintext on 0.0.0.0:{port}, which other hosts may reach" in plain.log()
    finally:
        assert plain.stop() == 0
    tls = start_sidecar_process(
        tmp_path / "tls", *_tls_args(pki), listen=[f"unix:{tmp_path / 't.sock'}", f"0.0.0.0:{port}"]
    )
    try:
        assert "serving plaintext" not in tls.log()
    finally:
        assert tls.stop() == 0


def test_a_client_from_the_environment_reads_what_the_command_line_reads(
    tls_sidecar: Sidecar, pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for var in ENV_VARS.values():
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="CKPT_TARGET is not set"):
        CheckpointClient.from_env()
    monkeypatch.setenv("CKPT_TARGET", tls_sidecar.tcp_target)
    monkeypatch.setenv("CKPT_TLS_CA_FILE", str(pki["ca"]))
    with CheckpointClient.from_env(timeout_seconds=10) as c:
        c.put("env", b"from the environment")

    async def read() -> bytes:
        async with AsyncCheckpointClient.from_env() as c:
            return (await c.get("env")).state

    assert asyncio.run(read()) == b"from the environment"
    with CheckpointClient.from_env(target=tls_sidecar.unix_target, tls=False) as c:  # arguments win
        assert c.get("env").state == b"from the environment"
    monkeypatch.setenv("CKPT_TLS_CA_FILE", str(tmp_path / "missing.pem"))
    with pytest.raises(ValueError, match=r"CKPT_TLS_CA_FILE '.*missing.pem' cannot be read"):
        CheckpointClient.from_env()
    monkeypatch.delenv("CKPT_TLS_CA_FILE")
    monkeypatch.setenv("CKPT_MAX_MESSAGE_BYTES", "64MiB")
    with pytest.raises(ValueError, match="CKPT_MAX_MESSAGE_BYTES '64MiB' is not an integer"):
        CheckpointClient.from_env()


def test_the_command_line_names_a_client_certificate_when_mutual_tls_refuses_it(
    mtls_sidecar: Sidecar, pki: dict[str, Path]
) -> None:
    command = ["get", "s", "--target", mtls_sidecar.tcp_target, "--tls-ca-file", str(pki["ca"])]
    done = subprocess.run(
        [sys.executable, "-m", "ckpt.sidecar.cli", *command],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("CKPT_")},
    )
    assert done.returncode == 1
    assert "if it asks for a client certificate (mutual TLS), give --tls-client-cert-file and" in done.stderr
