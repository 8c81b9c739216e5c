"""The data directory's lock: one store process writes a data directory at a time."""

from __future__ import annotations

import fcntl
import os
from typing import Any

from ..errors import Unavailable
from ..storage import PRIVATE_FILE_MODE, in_use_in_this_process


def lock_data_dir(data_dir: os.PathLike[str], *, holder: str | None = None) -> Any:
    """Hold an exclusive lock on the data directory for the store's lifetime.

    ``holder`` is who another process trying to lock it is told holds it
    (default ``pid N``, this process): `ckpt serve`'s store process names the
    process to stop, its parent, rather than itself.
    """
    path = os.path.join(data_dir, "ckpt.lock")
    # "a+", made private; held open until close().
    fh = open(os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, PRIVATE_FILE_MODE), "a+")  # noqa: SIM115
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        held_by = fh.read().strip() or "another process"
        fh.close()
        if held_by == f"pid {os.getpid()}":
            raise in_use_in_this_process(data_dir) from None
        raise Unavailable(f"data directory {data_dir} is in use by {held_by}") from None
    fh.seek(0)
    fh.truncate()
    fh.write(f"{holder or f'pid {os.getpid()}'}\n")
    fh.flush()
    return fh
