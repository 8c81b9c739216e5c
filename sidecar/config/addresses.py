"""`--listen` addresses: the one parser of ``host:port`` (the config checks it, the server binds by it), and
the check that no two addresses bind the same one.

No grpc here: the configuration is read before `ckpt serve` imports it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os

from ..limits import is_port

#: Address prefixes of sockets in the file system or the abstract namespace, which gRPC binds as given.
SOCKET_PREFIXES = ("unix:", "unix-abstract:")

#: Hosts that bind every address of the machine. gRPC binds either as a dual-stack socket on [::]
#: where it can, so each overlaps every IPv4 and IPv6 address on the same port.
_WILDCARDS = ("0.0.0.0", "::")


def is_socket(address: str) -> bool:
    """Whether ``address`` is a unix socket's (``unix:/path``, ``unix-abstract:name``), not ``host:port``."""
    return address.startswith(SOCKET_PREFIXES)


def host_and_port(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as (host, port), the brackets taken off.

    ValueError, naming ``listen``, unless the port is one (limits.is_port) and the host is given, an IPv6
    one in brackets (gRPC refuses "::1:50051" as a misformatted name, and binds "localhost" on 443).
    """
    host, sep, port = address.rpartition(":")
    if not sep:
        raise ValueError(f"listen address must be unix:/path or host:port, got {address!r}")
    if not is_port(port):
        raise ValueError(f"listen port must be in 0..65535, got {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"listen IPv6 address must be in brackets, as [::1]:50051, got {address!r}")
    if not host:
        raise ValueError(f"listen address needs a host (0.0.0.0 or [::] for every address), got {address!r}")
    return host, int(port)


def check_listen(listen: tuple[str, ...]) -> None:
    """ValueError, naming ``listen``, if an address is no socket's nor a valid ``host:port``, or if two
    bind the same address (gRPC would fail the second, as if another process held it)."""
    for address in listen:
        if not is_socket(address):
            host_and_port(address)
        elif address in SOCKET_PREFIXES:  # gRPC would take "unix:" as the working directory, "."
            raise ValueError(f"listen address {address!r} names no socket: give unix:/path or unix-abstract:name")
    seen: dict[tuple[str, ...], str] = {}
    for address in listen:
        for key in _listen_keys(address):
            clash = key if key in seen else _overlapping(key, seen)
            if clash is None:
                seen[key] = address
                continue
            first = seen[clash]
            if first == address:
                raise ValueError(f"listen gives {address!r} twice: give each address once")
            raise ValueError(
                f"listen gives {first!r} and {address!r}, which both bind {_bound(key, clash)}: give each once"
            )


def _listen_keys(address: str) -> list[tuple[str, ...]]:
    """What ``address`` binds, by name: a unix socket's normalised path, or each (IP or host, port) of
    host:port (localhost: both loopbacks, as gRPC binds it). Port 0 binds a free port: never a clash."""
    if address.startswith("unix:"):
        return [("unix", os.path.abspath(address[len("unix:") :]))]
    if is_socket(address):
        return [("abstract", address)]
    host, port = host_and_port(address)
    if port == 0:
        return []
    hosts = ["::1", "127.0.0.1"] if host == "localhost" else [host]
    keys: list[tuple[str, ...]] = []
    for name in hosts:
        with contextlib.suppress(ValueError):
            name = str(ipaddress.ip_address(name))
        keys.append(("tcp", name, str(port)))
    return keys


def _overlapping(key: tuple[str, ...], seen: dict[tuple[str, ...], str]) -> tuple[str, ...] | None:
    """The key seen that ``key`` overlaps through a wildcard host (same port), if any."""
    if key[0] != "tcp":
        return None
    for other in seen:
        if other[0] == "tcp" and other[2] == key[2] and (other[1] in _WILDCARDS or key[1] in _WILDCARDS):
            return other
    return None


def _bound(key: tuple[str, ...], clash: tuple[str, ...]) -> str:
    """What two clashing keys both bind, as the error names it."""
    if key[0] != "tcp":
        return key[1]
    if key == clash:
        return f"{key[1]}:{key[2]}"
    wildcard = next(each[1] for each in (clash, key) if each[1] in _WILDCARDS)
    specific = [each[1] for each in (clash, key) if each[1] not in _WILDCARDS]
    where = f"{specific[0]}:{key[2]}" if specific else f"port {key[2]} of every address"
    return f"{where} ({'[::]' if wildcard == '::' else wildcard} stands for every address)"
