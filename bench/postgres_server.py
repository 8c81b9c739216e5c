"""A throwaway PostgreSQL server for the benchmarks' PostgresSaver peer: initdb into a scratch directory,
started on a unix socket only (no TCP port to collide with), ``synchronous_commit=on`` and ``fsync=on``
set explicitly (PostgreSQL's defaults, named so the run records them), stopped and removed at the end.

The binaries come from ``$CKPT_PG_BIN`` or Debian's ``/usr/lib/postgresql/<major>/bin`` (the newest
there), else ``initdb`` on PATH. PostgreSQL refuses to run as root: as root, the server runs as the
``postgres`` user the Debian package creates, owning its cluster's directory (in the scratch directory,
or in the system's temporary directory when that user cannot reach the scratch directory).
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "CKPT_PG_BIN"
DEBIAN_ROOT = Path("/usr/lib/postgresql")
INSTALL_HINT = "install Debian's postgresql package (apt-get install postgresql) or point $CKPT_PG_BIN at its bin/"
_RUN_AS = "postgres"


class PostgresMissing(RuntimeError):
    """No PostgreSQL server binaries here, or no user to run them as; the message says how to get them."""


@dataclass(frozen=True, slots=True)
class PostgresServer:
    bin_dir: Path
    data_dir: Path
    socket_dir: Path
    #: A libpq connection string for the server's database.
    conninfo: str
    version: str


def find_bin_dir() -> Path:
    """The directory holding initdb, pg_ctl and postgres; PostgresMissing with the install hint if none."""
    if env := os.environ.get(ENV_VAR):
        candidates = [Path(env)]
    else:
        majors = sorted(DEBIAN_ROOT.glob("*/bin"), key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
        candidates = list(reversed(majors))
        if on_path := shutil.which("initdb"):
            candidates.append(Path(on_path).parent)
    for directory in candidates:
        if all((directory / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres")):
            return directory
    looked = ", ".join(str(c) for c in candidates) or f"{DEBIAN_ROOT}/*/bin and PATH"
    raise PostgresMissing(f"PostgreSQL server binaries not found (looked in {looked}); {INSTALL_HINT}")


def _user_ids() -> tuple[int, int] | None:
    """(uid, gid) to run the server as when this process is root; None when it is not."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(_RUN_AS)
    except KeyError:
        raise PostgresMissing(
            f"running as root, and PostgreSQL refuses root: no {_RUN_AS!r} user to run it as; {INSTALL_HINT}"
        ) from None
    return entry.pw_uid, entry.pw_gid


def _traversable(path: Path) -> bool:
    """Whether any user may pass through every directory down to ``path`` (each exists, with o+x)."""
    path = path.resolve()
    path.mkdir(parents=True, exist_ok=True)
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in (path, *path.parents))


def _run(cmd: list[str], ids: tuple[int, int] | None, log: Path) -> None:
    kwargs = {"user": ids[0], "group": ids[1], "extra_groups": []} if ids else {}
    with log.open("ab") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=120, check=False, **kwargs)  # type: ignore[call-overload]
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:2])} failed ({proc.returncode}): {log.read_text(errors='replace')[-2000:]}")


@contextmanager
def running(scratch: Path) -> Iterator[PostgresServer]:
    """A new cluster under ``scratch``/postgres, serving until the block ends (then stopped, ``fast``)."""
    bin_dir = find_bin_dir()
    ids = _user_ids()
    root = scratch / "postgres"
    if ids and not _traversable(scratch):
        # The server's user cannot reach a private scratch directory (pytest's are 0700): a directory of its
        # own in the system's temporary directory instead.
        root = Path(tempfile.mkdtemp(prefix="ckpt-pg-cluster-"))
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    data_dir = root / "data"
    # A socket's path must fit sun_path (108 bytes): a short directory of its own.
    socket_dir = Path(tempfile.mkdtemp(prefix="ckpt-pg-"))
    log = root / "server.log"
    log.touch()
    if ids:
        for path in (root, socket_dir, log):
            os.chown(path, *ids)
    started = False
    try:
        _run([str(bin_dir / "initdb"), "-D", str(data_dir), "-U", "bench", "-A", "trust", "-E", "UTF8",
              "--no-instructions"], ids, log)  # fmt: skip
        options = (
            f"-c listen_addresses='' -c unix_socket_directories='{socket_dir}' -c synchronous_commit=on"
            " -c fsync=on -c max_connections=200"
        )
        _run([str(bin_dir / "pg_ctl"), "-D", str(data_dir), "-l", str(log), "-w", "-o", options, "start"], ids, log)
        started = True
        version = subprocess.run(
            [str(bin_dir / "postgres"), "--version"], capture_output=True, text=True, check=False
        ).stdout.strip()
        yield PostgresServer(
            bin_dir=bin_dir,
            data_dir=data_dir,
            socket_dir=socket_dir,
            conninfo=f"host={socket_dir} user=bench dbname=postgres",
            version=version,
        )
    finally:
        if started:
            _run([str(bin_dir / "pg_ctl"), "-D", str(data_dir), "-w", "-m", "fast", "stop"], ids, log)
        shutil.rmtree(socket_dir, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
