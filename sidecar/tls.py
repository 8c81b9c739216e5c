"""TLS for the sidecar's host:port listeners, and for clients connecting to them.

Unix sockets are always plaintext: the socket file's permissions are their
access control, and a sidecar beside its agent needs nothing more. A TCP
listener reachable from other hosts (a container's 0.0.0.0:50051) should
have a certificate, and with ``client_ca_file`` it takes only clients holding
a certificate that CA signed (mutual TLS): without that, anyone who reaches
the port can read, overwrite and delete every session.

PEM files are checked with the standard library's ``ssl`` when the
configuration is made (a key that does not match its certificate, a file
that is not PEM), so a mistake stops ``ckpt serve`` at start with the file
named, not every client at its first handshake; and again whenever they
change while it serves (a renewed certificate is taken without a restart).
"""

from __future__ import annotations

import logging
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

log = logging.getLogger(__name__)


def server_credentials(
    *, cert_file: Path, key_file: Path, client_ca_file: Path | None = None
) -> grpc.ServerCredentials:
    """Credentials for a TCP listener: this certificate chain and key, and with
    ``client_ca_file`` required client certificates signed by that CA.

    The files are read again when they change (checked as each new connection
    arrives), so a renewed certificate serves new connections without a
    restart; connections already open keep theirs. Files that do not load at
    that point (a certificate written before its key) are logged and the last
    good ones kept. Raises ValueError naming the field (``tls_cert_file``,
    ``tls_key_file``, ``tls_client_ca_file``) whose file is missing,
    unreadable or not what it should be now.
    """
    reloading = _ReloadingCertificates(cert_file, key_file, client_ca_file)
    return grpc.dynamic_ssl_server_credentials(
        reloading.initial, reloading.fetch, require_client_authentication=client_ca_file is not None
    )


class _ReloadingCertificates:
    """gRPC's certificate fetcher: a new configuration once the files changed and load, else None (no change)."""

    def __init__(self, cert_file: Path, key_file: Path, client_ca_file: Path | None) -> None:
        self._files = (cert_file, key_file, client_ca_file)
        self._stamp = self._stamps()
        self.initial = self._load()
        self._lock = threading.Lock()  # gRPC may call fetch from several threads at once

    def _stamps(self) -> tuple[tuple[int, int, int] | None, ...]:
        out: list[tuple[int, int, int] | None] = []
        for path in self._files:
            try:
                st = None if path is None else path.stat()
            except OSError:
                st = None
            out.append(None if st is None else (st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(out)

    def _load(self) -> grpc.ServerCertificateConfiguration:
        cert_file, key_file, client_ca_file = self._files
        assert cert_file is not None and key_file is not None
        chain = _read("tls_cert_file", cert_file)
        key = _read("tls_key_file", key_file)
        _check_key_pair("tls_cert_file", cert_file, "tls_key_file", key_file)
        client_ca = None
        if client_ca_file is not None:
            client_ca = _read("tls_client_ca_file", client_ca_file)
            _check_ca("tls_client_ca_file", client_ca_file)
        return grpc.ssl_server_certificate_configuration([(key, chain)], root_certificates=client_ca)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        # Must not raise: gRPC would fail the handshake. A stat of each file per new connection.
        try:
            with self._lock:
                stamp = self._stamps()
                if stamp == self._stamp:
                    return None
                self._stamp = stamp  # tried once per change: the next change (the key, say) is tried again
                try:
                    config = self._load()
                except ValueError as exc:
                    log.warning("TLS files changed but do not load; still serving the previous ones: %s", exc)
                    return None
                log.info("TLS files changed: new connections get the certificate now in %s", self._files[0])
                return config
        except Exception:  # a bug here must not take TLS down
            log.exception("could not check the TLS files; still serving the previous ones")
            return None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientTLS:
    """TLS for a client's connection to a sidecar's host:port listener (``ckpt serve --tls-cert-file``).

    ``root_certificates``: PEM of the CA(s) that signed the sidecar's
    certificate (None: the system's CAs). ``client_certificate_chain`` and
    ``client_private_key``: this client's certificate, for a sidecar that
    requires one (``--tls-client-ca-file``). ``server_name``: the name the
    sidecar's certificate is checked against, when not the target's host
    (connecting to an IP address the certificate does not list, say).
    """

    root_certificates: bytes | None = None
    client_certificate_chain: bytes | None = None
    client_private_key: bytes | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        for name in ("root_certificates", "client_certificate_chain", "client_private_key"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bytes):
                raise TypeError(f"{name} must be PEM bytes or None, not {type(value).__name__}")
        if (self.client_certificate_chain is None) != (self.client_private_key is None):
            raise ValueError("client_certificate_chain and client_private_key go together: give both or neither")
        if self.server_name is not None and (not isinstance(self.server_name, str) or not self.server_name):
            raise ValueError(f"server_name must be a non-empty host name or None, got {self.server_name!r}")

    @classmethod
    def from_files(
        cls,
        *,
        ca_file: str | Path | None = None,
        cert_file: str | Path | None = None,
        key_file: str | Path | None = None,
        server_name: str | None = None,
    ) -> ClientTLS:
        """The same, read from PEM files (``ca_file``: the sidecar's CA; ``cert_file``/``key_file``: this client's)."""
        if (cert_file is None) != (key_file is None):
            raise ValueError("tls_client_cert_file and tls_client_key_file go together: give both or neither")
        if ca_file is not None:
            _check_ca("tls_ca_file", Path(ca_file))
        if cert_file is not None and key_file is not None:
            _check_key_pair("tls_client_cert_file", Path(cert_file), "tls_client_key_file", Path(key_file))
        return cls(
            root_certificates=None if ca_file is None else _read("tls_ca_file", Path(ca_file)),
            client_certificate_chain=None if cert_file is None else _read("tls_client_cert_file", Path(cert_file)),
            client_private_key=None if key_file is None else _read("tls_client_key_file", Path(key_file)),
            server_name=server_name,
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.root_certificates,
            private_key=self.client_private_key,
            certificate_chain=self.client_certificate_chain,
        )

    def channel_options(self) -> list[tuple[str, str]]:
        return [] if self.server_name is None else [("grpc.ssl_target_name_override", self.server_name)]


def client_tls_from_files(
    *,
    ca_file: str | Path | None = None,
    cert_file: str | Path | None = None,
    key_file: str | Path | None = None,
    server_name: str | None = None,
) -> ClientTLS | None:
    """TLS as the command line's options and the CKPT_TLS_* variables set it: None (plaintext) when no file
    is given. A server name alone is refused: it would say TLS trusting the system's CAs, which is not
    what a sidecar's own CA needs (``ClientTLS(server_name=...)`` says that when it is meant)."""
    if ca_file is None and cert_file is None and key_file is None:
        if server_name is not None:
            raise ValueError("tls_server_name needs tls_ca_file (or the client certificate options)")
        return None
    return ClientTLS.from_files(ca_file=ca_file, cert_file=cert_file, key_file=key_file, server_name=server_name)


def open_channel(target: str, tls: ClientTLS | None, options: list[tuple[str, Any]], *, aio: bool) -> Any:
    """A gRPC channel (grpc.aio's with ``aio``) to ``target``: plaintext, or with ``tls``."""
    if tls is None:
        return (grpc.aio.insecure_channel if aio else grpc.insecure_channel)(target, options=options)
    secure = grpc.aio.secure_channel if aio else grpc.secure_channel
    return secure(target, tls.channel_credentials(), options=[*options, *tls.channel_options()])


def _check_key_pair(cert_field: str, cert_file: Path, key_field: str, key_file: Path) -> None:
    """ValueError naming both fields unless ``key_file`` is the private key of the PEM chain in ``cert_file``.

    An encrypted key is refused by name: gRPC takes no passphrase, and OpenSSL,
    asked for one, would prompt on the terminal (in ``ckpt serve``, holding up
    every handshake); the password callback makes it ask this code instead.
    """
    try:
        ssl.create_default_context().load_cert_chain(cert_file, key_file, password=_no_passphrase)
    except _PassphraseNeeded:
        raise ValueError(
            f"{key_field} {str(key_file)!r} is encrypted (it needs a passphrase; ckpt takes unencrypted keys)"
        ) from None
    except ssl.SSLError as exc:
        raise ValueError(
            f"{cert_field} {str(cert_file)!r} and {key_field} {str(key_file)!r} are not a PEM certificate chain"
            f" and its private key ({exc.reason or exc})"
        ) from None
    except OSError as exc:  # read between checks, or another way OpenSSL fails to load them
        raise ValueError(
            f"{cert_field} {str(cert_file)!r} and {key_field} {str(key_file)!r} cannot be loaded: {exc.strerror or exc}"
        ) from None


class _PassphraseNeeded(Exception):
    """Raised by the password callback: OpenSSL wanted a passphrase for the key."""


def _no_passphrase() -> str:
    raise _PassphraseNeeded


def _read(field: str, path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{field} {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise ValueError(f"{field} {str(path)!r} is not a PEM file (no -----BEGIN line)")
    return data


def _check_ca(field: str, path: Path) -> None:
    _read(field, path)
    try:
        ssl.create_default_context().load_verify_locations(cafile=path)
    except ssl.SSLError as exc:
        raise ValueError(f"{field} {str(path)!r} holds no usable PEM CA certificate ({exc.reason or exc})") from None
