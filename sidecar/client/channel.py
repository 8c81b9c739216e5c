"""A client's connection: its gRPC channel's options, TLS, the CKPT_* environment, and closing it."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

from ..limits import is_port
from ..tls import ClientTLS, client_tls_from_files

log = logging.getLogger(__package__)

#: What ``from_env`` reads: the variables the ``ckpt`` command line reads, by the client option they set.
ENV_VARS = {
    "target": "CKPT_TARGET",
    "max_message_bytes": "CKPT_MAX_MESSAGE_BYTES",
    "tls_ca_file": "CKPT_TLS_CA_FILE",
    "tls_client_cert_file": "CKPT_TLS_CLIENT_CERT_FILE",
    "tls_client_key_file": "CKPT_TLS_CLIENT_KEY_FILE",
    "tls_server_name": "CKPT_TLS_SERVER_NAME",
}


def from_environment(environ: Mapping[str, str], options: dict[str, Any]) -> dict[str, Any]:
    """A client's arguments from CKPT_* variables (see ENV_VARS), ``options`` winning over them."""
    env = {name: value for name, var in ENV_VARS.items() if (value := environ.get(var, ""))}
    out: dict[str, Any] = {}
    if "target" not in options:
        if "target" not in env:
            raise ValueError("CKPT_TARGET is not set: the sidecar's address, unix:/path or host:port")
        out["target"] = env["target"]
    if "max_message_bytes" in env and "max_message_bytes" not in options:
        text = env["max_message_bytes"]
        if not (text.isascii() and text.isdigit()):  # int() takes "1_0", " 10" and other scripts' digits
            raise ValueError(f"CKPT_MAX_MESSAGE_BYTES {text!r} is not an integer")
        out["max_message_bytes"] = int(text)
    if "tls" not in options:
        try:
            tls = client_tls_from_files(
                ca_file=env.get("tls_ca_file"),
                cert_file=env.get("tls_client_cert_file"),
                key_file=env.get("tls_client_key_file"),
                server_name=env.get("tls_server_name"),
            )
        except ValueError as exc:
            raise ValueError(in_variable_terms(str(exc), ENV_VARS)) from None  # TLS is from the variables alone
        if tls is not None:
            out["tls"] = tls
    return {**out, **options}


def in_variable_terms(message: str, names: Iterable[str]) -> str:
    """An error with the client options ``names`` (set from the environment) spelled as their variables."""
    for name in names:
        if name in ENV_VARS:
            message = re.sub(rf"\b{name}\b", ENV_VARS[name], message)
    return message


def check_target_port(target: str) -> None:
    """ValueError, naming ``target``, if a ``host:port`` target's port is not one (limits.is_port): gRPC
    takes "116916" (or "-14156") modulo 65536 and connects to another port. Targets in gRPC's own
    forms (``dns:///...``, ``ipv4:...``) and unix sockets are left to it."""
    if target.startswith(("unix:", "unix-abstract:")) or "://" in target or target.endswith("]"):
        return
    _, sep, port = target.rpartition(":")
    if sep and not is_port(port):
        raise ValueError(f"target port must be in 0..65535, got {target!r}")


def tls_of(target: str, tls: object) -> ClientTLS | None:
    """The ``tls`` argument as a ClientTLS (True: the system's CAs), or None for plaintext."""
    if tls is False or tls is None:
        return None
    if tls is True:
        tls = ClientTLS()
    if not isinstance(tls, ClientTLS):
        raise TypeError(f"tls must be a ClientTLS, True or False, not {type(tls).__name__}")
    if target.startswith(("unix:", "unix-abstract:")):
        raise ValueError(
            f"tls is for host:port targets; {target!r} is a unix socket, which the sidecar serves without TLS"
            " (its file's permissions guard it)"
        )
    return tls


def channel_options(max_message_bytes: int, *, own_connection: bool = False) -> list[tuple[str, int]]:
    # gRPC shares one connection among a process's channels to the same target
    # (its global subchannel pool); a worker of `ckpt serve --workers` serves
    # whole connections, so a client wanting its own asks for a pool of its own.
    own = [("grpc.use_local_subchannel_pool", 1)] if own_connection else []
    return [
        *own,
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # gRPC waits 1 s, then 1.6x longer each time (up to 2 min), before it
        # reconnects to a sidecar that went away; calls meanwhile fail at once.
        # The sidecar is local: reconnect within the retries' backoff instead.
        # Capped at 1 s, a sidecar back after ~1.8 s was still not reconnected
        # when the last retry ran (then 2.55 s after the first failure); a failed
        # connect to a local socket costs next to nothing, so try every 250 ms.
        ("grpc.initial_reconnect_backoff_ms", 50),
        ("grpc.min_reconnect_backoff_ms", 50),
        ("grpc.max_reconnect_backoff_ms", 250),
    ]


def warn_not_closed(seconds: float) -> None:
    """Said when close() gave gRPC ``seconds`` (timeout_seconds) to end the channel's calls, and it had not."""
    log.warning(
        "the gRPC channel had not closed after %.1f s (timeout_seconds): a call is still under way in"
        " gRPC (is the sidecar stopped or hung?); it goes on closing in the background",
        seconds,
    )
