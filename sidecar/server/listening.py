"""Listening: unix socket paths and TCP names claimed before gRPC binds them, errors that name the cause.

gRPC alone would unlink and rebind a unix socket another live server answers
on, listen on only some of the addresses a host name stands for, and report
a failed bind as "Failed to bind"; each check here refuses such an address
with an Unavailable that says why.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
import stat
from pathlib import Path

import grpc
import grpc.aio

from ..config.addresses import host_and_port, is_socket
from ..errors import Unavailable

#: A unix socket a server bound: its path and (st_dev, st_ino), what it may remove at its stop.
UnixSocket = tuple[Path, tuple[int, int]]


def bind(
    server: grpc.aio.Server, address: str, tls: grpc.ServerCredentials | None, *, shared_port: bool
) -> tuple[str, UnixSocket | None]:
    """Have ``server`` listen on ``address``: the address as served (a TCP port 0 replaced by the
    port bound, what the log names), and for a unix socket, its path and identity.

    ``shared_port``: a worker of ``--workers``, binding a port its siblings bind too (their parent
    checked that no one else listens there).
    """
    path = None
    if address.startswith("unix:"):
        path = Path(address[len("unix:") :])
        _check_unix_path_size(address[len("unix:") :])  # as given: what gRPC binds, not normalised
        _claim_unix_socket(path)
    elif not shared_port:
        _claim_tcp_name(address)
    try:
        if path is None and tls is not None:
            port = server.add_secure_port(address, tls)
        else:
            port = server.add_insecure_port(address)
    except RuntimeError as exc:  # gRPC's own words: "Failed to bind ... set GRPC_VERBOSITY=debug"
        why = path is None and _why_unbindable(address)
        raise Unavailable(f"cannot listen on {address}: {why or exc}") from None
    if not port:
        why = path is None and _why_unbindable(address)
        raise Unavailable(f"cannot listen on {address}: {why or 'the address is in use or invalid'}")
    asked = _host_and_port(address)
    served = f"{address.rpartition(':')[0]}:{port}" if asked is not None and asked[1] == 0 else address
    if path is None:
        return served, None
    st = path.lstat()  # gRPC binds (creates the file) when the port is added
    return served, (path, (st.st_dev, st.st_ino))


def remove_unix_socket(sock: UnixSocket) -> None:
    """Remove a socket this server bound, if the path is still that socket.

    Only our own: once a server stopped listening (at the start of its grace
    period), another one may have claimed the path.
    """
    path, identity = sock
    with contextlib.suppress(FileNotFoundError):
        st = path.lstat()
        if (st.st_dev, st.st_ino) == identity:
            path.unlink()


# sockaddr_un.sun_path is 108 bytes on Linux, the last kept for a NUL.
_MAX_UNIX_PATH_BYTES = 107


def _check_unix_path_size(path: str) -> None:
    size = len(os.fsencode(path))
    if size > _MAX_UNIX_PATH_BYTES:
        raise Unavailable(
            f"cannot listen on unix:{path}: the path is {size} bytes, over the {_MAX_UNIX_PATH_BYTES} a unix"
            " socket's address holds (sun_path); give --listen a shorter unix: path (or a shorter --data-dir)"
        )


def _claim_unix_socket(path: Path) -> None:
    """Refuse a socket path another live server answers on; remove a stale one.

    gRPC would otherwise unlink and rebind it silently, stealing the address.
    """
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return
    if not stat.S_ISSOCK(mode):
        # connect() to a regular file is refused as a dead socket's is: a
        # mistyped path must not cost the user that file.
        raise Unavailable(f"cannot listen on unix:{path}: it exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)  # left behind by a process that died
        return
    finally:
        probe.close()
    raise Unavailable(f"another server is listening on unix:{path}")


def reachable_from_other_hosts(address: str) -> bool:
    """Whether a host:port listen address may take connections from other machines (not loopback only)."""
    host_port = _host_and_port(address)
    if host_port is None:
        return False
    try:
        ips = [ip for _, ip in tcp_addresses_of(*host_port)]
    except OSError:
        return True  # unknown: say so rather than stay quiet
    return not all(ipaddress.ip_address(ip.partition("%")[0]).is_loopback for ip in ips)


def tcp_addresses_of(host: str, port: int) -> list[tuple[int, str]]:
    """The (address family, IP) a listen host stands for, as gRPC resolves it; OSError if it does not resolve."""
    with contextlib.suppress(ValueError):
        ip = ipaddress.ip_address(host)
        return [(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, host)]
    if host == "localhost":  # gRPC's resolver gives both loopbacks, whatever /etc/hosts says (RFC 6761)
        return [(socket.AF_INET6, "::1"), (socket.AF_INET, "127.0.0.1")]
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys((family, str(sockaddr[0])) for family, _, _, _, sockaddr in infos))


def _host_and_port(address: str) -> tuple[str, int] | None:
    """``host:port`` (``[v6]:port`` too) as (host, port) (config/addresses.py: the configuration checked
    it); None for a unix socket's address, or one the configuration would refuse."""
    if is_socket(address):
        return None
    try:
        return host_and_port(address)
    except ValueError:
        return None


def _bind_error(family: int, ip: str, port: int) -> OSError | None:
    """What binding ``ip``:``port`` as gRPC binds (SO_REUSEADDR: TIME_WAIT is no owner) fails with, if it does."""
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((ip, port))
    except OSError as exc:
        return exc
    finally:
        probe.close()
    return None


def _why_unbindable(address: str) -> str | None:
    """Why gRPC could not bind ``host:port``, found by binding it ourselves (None if that works, or cannot say)."""
    host_port = _host_and_port(address)
    if host_port is None:
        return None
    host, port = host_port
    try:
        candidates = tcp_addresses_of(host, port)
    except OSError as exc:
        return f"{host} does not resolve ({exc.strerror or exc})"
    for family, ip in candidates:
        shown = f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}"
        if (failed := _bind_error(family, ip, port)) is not None:
            if failed.errno == errno.EADDRINUSE:
                return f"{shown} is in use (another process listens there)"
            return f"{shown}: {failed.strerror or failed}"
    return None


def _claim_tcp_name(address: str) -> None:
    """Refuse ``host:port`` when another socket holds any address the host name stands for.

    gRPC listens on a name that resolves to several addresses (``localhost``:
    ::1 and 127.0.0.1) if it can bind any one of them, and only logs the rest:
    with 127.0.0.1:P held by another server, ``--listen localhost:P`` would
    serve on ::1 alone, and a client dialing 127.0.0.1:P would reach the other
    server. An address literal needs no check (gRPC fails to bind it), nor
    does port 0 (a free port). An address this machine lacks (::1 without
    IPv6) is skipped, as gRPC skips it.
    """
    host_port = _host_and_port(address)
    if host_port is None or not host_port[0] or not 0 < host_port[1] <= 65535:
        return  # not host:port: gRPC judges it
    host, port = host_port
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(host)
        return
    try:
        candidates = tcp_addresses_of(host, port)
    except OSError:
        return  # gRPC says what it cannot resolve
    for family, ip in candidates:
        exc = _bind_error(family, ip, port)
        if exc is not None and exc.errno == errno.EADDRINUSE:  # other errors (no ::1 here): gRPC skips it too
            shown = f"[{ip}]" if family == socket.AF_INET6 else ip
            raise Unavailable(
                f"cannot listen on {address}: {shown}:{port} is in use (another process listens there),"
                f" and {host} stands for it; gRPC would listen on {host}'s other addresses only"
            )


def claim_port(address: str) -> list[socket.socket]:
    """For ``--workers``: a socket bound (not listening) on each address ``host:port`` stands for, which
    the caller keeps open until its workers stop; Unavailable if another socket holds any of them.

    Each is bound as the check: SO_REUSEADDR (TIME_WAIT is no owner) without SO_REUSEPORT, so a socket
    that set it (another server's workers) counts as taken too. Then the same socket, still bound, drops
    SO_REUSEADDR and sets SO_REUSEPORT: the workers (same user, SO_REUSEPORT) still bind beside it, while
    another server's check, as this one, now fails with EADDRINUSE (Linux). Had it kept SO_REUSEADDR,
    that check would pass, two bound sockets that both set it sharing the port, and a second server's
    workers would join the first's: each server's writes landing in either store. The check is the
    hold: no window is left between them. A socket bound but never listening takes no connections.
    """
    host, port = host_and_port(address)
    held: list[socket.socket] = []
    try:
        for family, ip_text in tcp_addresses_of(host, port):
            try:
                probe = socket.socket(family, socket.SOCK_STREAM)
            except OSError:
                continue  # no IPv6 here: gRPC skips it as well
            try:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind((ip_text, port))
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            except OSError as exc:
                probe.close()
                if exc.errno == errno.EADDRINUSE:
                    raise Unavailable(
                        f"cannot listen on {address}: {ip_text}:{port} is in use by another process"
                    ) from None
                if exc.errno != errno.EADDRNOTAVAIL:
                    raise Unavailable(f"cannot listen on {address}: {exc.strerror or exc}") from None
                continue
            held.append(probe)
    except BaseException:
        for sock in held:
            sock.close()
        raise
    return held
