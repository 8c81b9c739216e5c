"""What a power cut leaves on disk: a process run under powercut.c (``LD_PRELOAD``) records, in a shadow
directory, each file's flushed bytes, its writes since, and each directory's flushed entries;
:meth:`PowerCut.rebuild` makes such a disk as a directory tree, to open a store on as a machine restarted
after the cut would.

The least a cut leaves is what was flushed. It may leave more: any of the writes not flushed yet, each page
of them on its own (the page cache writes pages back in no set order), and a directory's entries as they were
at the cut rather than as last flushed. ``rebuild(rng=...)`` picks one such disk at random."""

from __future__ import annotations

import os
import random
import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support import ckpt

SOURCE = Path(__file__).with_name("powercut.c")
#: readdir's d_type of a directory and of a regular file.
_DT_DIR, _DT_REG = 4, 8
#: The unit in which writes not flushed reach the disk, or not.
PAGE_BYTES = 4096
_PENDING_HEAD = struct.Struct("=qq")  # a pending write's offset and length


def build_library(into: Path) -> Path:
    """powercut.c compiled into a shared library in ``into``; RuntimeError with the compiler's words if it fails."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("the power cut tests need a C compiler (cc or gcc): .ci/run installs gcc")
    library = into / "libpowercut.so"
    done = subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(library), str(SOURCE), "-ldl"],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"compiling {SOURCE.name} failed:\n{done.stderr}")
    return library


@dataclass(frozen=True)
class PowerCut:
    """A directory (``watched``, made here) whose files a process run with :meth:`env` records in ``shadow``."""

    library: Path
    watched: Path
    shadow: Path

    @classmethod
    def make(cls, library: Path, watched: Path, shadow: Path) -> PowerCut:
        watched.mkdir(parents=True)
        (shadow / "inodes").mkdir(parents=True)
        (shadow / "dirs").mkdir()
        (shadow / "pending").mkdir()
        return cls(library, watched, shadow)

    def adopt(self) -> None:
        """Take what the watched directory holds now as flushed: a store a test made before the recorded
        process runs (a power cut cannot undo what an earlier, finished run flushed)."""
        for path in [self.watched, *(Path(e.path) for e in _walk(self.watched))]:
            listing = _listing(path)
            for ino, d_type, name in listing:
                if d_type == _DT_REG:
                    shutil.copyfile(path / name, self.shadow / "inodes" / str(ino))
            lines = "".join(f"{ino} {d_type} {name}\n" for ino, d_type, name in listing)
            (self.shadow / "dirs" / str(os.stat(path).st_ino)).write_text(lines)

    def steps(self) -> int:
        """How many steps (writes, flushes, renames) the recorded processes made, all told: of a run not cut,
        the steps it may be cut at."""
        counted = self.shadow / "steps"
        return struct.unpack_from("=q", counted.read_bytes())[0] if counted.exists() else 0

    def env(self) -> dict[str, str]:
        """This process's environment with the library preloaded (children inherit it)."""
        return {
            **os.environ,
            "LD_PRELOAD": str(self.library),
            "POWERCUT_DIR": str(self.watched),
            "POWERCUT_SHADOW": str(self.shadow),
        }

    def rebuild(self, into: Path, *, rng: random.Random | None = None) -> Path:
        """The watched directory as a power cut now could leave it, made at ``into``: only what was flushed,
        or with ``rng`` that and a random part of the rest (see the module). The watched directory itself
        stands (the test made it before the cut)."""
        root = os.stat(self.watched).st_ino
        live = {entry.stat().st_ino: Path(entry.path) for entry in _walk(self.watched)} if rng else {}
        live[root] = self.watched
        _Rebuild(self.shadow, live, rng).dir(root, into)
        return into


def verified(data_dir: Path) -> None:
    """``ckpt verify`` passes on the store in ``data_dir``."""
    done = ckpt("verify", "--data-dir", str(data_dir))
    assert done.returncode == 0, (data_dir, done.stdout.decode() + done.stderr.decode())


def _listing(path: Path) -> list[tuple[int, int, str]]:
    """The directories and regular files in ``path`` as powercut.c lists a directory: inode, d_type, name."""
    with os.scandir(path) as entries:
        return [
            (e.inode(), _DT_DIR if e.is_dir(follow_symlinks=False) else _DT_REG, e.name)
            for e in entries
            if e.is_dir(follow_symlinks=False) or e.is_file(follow_symlinks=False)
        ]


def _walk(top: Path) -> list[os.DirEntry[str]]:
    found: list[os.DirEntry[str]] = []
    with os.scandir(top) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                found.append(entry)
                found += _walk(Path(entry.path))
    return found


@dataclass(frozen=True)
class _Rebuild:
    shadow: Path
    live: dict[int, Path]  # a directory's inode: its path now (with rng only)
    rng: random.Random | None

    def dir(self, ino: int, into: Path) -> None:
        into.mkdir(parents=True)
        for entry_ino, d_type, name in self._entries(ino):
            if d_type == _DT_DIR:
                self.dir(entry_ino, into / name)
            elif d_type == _DT_REG:
                (into / name).write_bytes(self._content(entry_ino))

    def _entries(self, ino: int) -> list[tuple[int, int, str]]:
        if self.rng is not None and ino in self.live and self.rng.random() < 0.5:  # as the cut found it
            return _listing(self.live[ino])
        listing = self.shadow / "dirs" / str(ino)
        if not listing.exists():  # never flushed: empty after the cut
            return []
        found = []
        for line in listing.read_text().splitlines():
            entry_ino, d_type, name = line.split(" ", 2)
            found.append((int(entry_ino), int(d_type), name))
        return found

    def _content(self, ino: int) -> bytes:
        flushed = self.shadow / "inodes" / str(ino)
        content = bytearray(flushed.read_bytes() if flushed.exists() else b"")
        pending = self.shadow / "pending" / str(ino)
        if self.rng is None or not pending.exists():
            return bytes(content)
        log, at = pending.read_bytes(), 0
        while at < len(log):
            offset, length = _PENDING_HEAD.unpack_from(log, at)
            at += _PENDING_HEAD.size
            if length < 0:  # a write placed nowhere (sendfile): left out, as it may be
                continue
            data = log[at : at + length]
            at += length
            start = offset
            while start < offset + length:  # page by page, each reaching the disk or not
                end = min(offset + length, (start // PAGE_BYTES + 1) * PAGE_BYTES)
                if self.rng.random() < 0.5:
                    if len(content) < end:
                        content.extend(bytes(end - len(content)))
                    content[start:end] = data[start - offset : end - offset]
                start = end
        return bytes(content)
