"""Where a benchmark's own sidecar listens: a unix socket in its scratch directory, or nearby when that is too deep."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


class ScratchSocket:
    """``directory``/ckpt.sock, or the same name in a new temporary directory where that path is too long
    for a socket's address (sun_path holds 108 bytes; deep scratch directories pass it)."""

    def __init__(self, directory: Path) -> None:
        path = str(directory / "ckpt.sock")
        self._temp_dir: str | None = None
        if len(path) > 100:
            self._temp_dir = tempfile.mkdtemp(prefix="ckpt-")
            path = os.path.join(self._temp_dir, "ckpt.sock")
        #: The sidecar's --listen address and its clients' target.
        self.target = f"unix:{path}"

    def remove(self) -> None:
        """Remove the temporary directory, if one was made (the sidecar stopped)."""
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None
