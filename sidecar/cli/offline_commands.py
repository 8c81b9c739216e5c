"""The commands that work on a data directory themselves: inspect, stats, backup, read-only, and compact
(verify: verify_command.py).

Each reads in a child process (sidecar/tools/isolated.py): a damaged page can make LMDB abort().
"""

from __future__ import annotations

import argparse
import json
import signal
import time
from functools import partial
from pathlib import Path
from typing import Any

from ...codec import DecodeError, FrameKind, frame_kind
from ...codec.frame_v2 import segment_distance
from ..config import StoreConfig
from ..errors import DataLoss
from ..store import SessionInfo, Store, VersionInfo, count_sessions, stored_frames
from ..store.prefixes import is_prefix
from ..tools import isolated, write_backup
from ..tools.backup import copy_with_blobs
from ..tools.compact import compact as compact_data_dir
from ..tools.compact import held_counts
from .output import utc


def open_readonly(data_dir: Path) -> Store:
    """The store, read-only. A damaged or truncated data file is DataLoss from the storage seam (a
    truncated one is refused before it is read: reading it could end in SIGBUS)."""
    return Store(StoreConfig(data_dir=data_dir), readonly=True)


def starts_chain(frame: bytes) -> bool:
    """Whether a stored frame is FULL, by its kind byte alone (read raw: its header may fail its checks)."""
    try:
        return frame_kind(frame) is FrameKind.FULL
    except DecodeError:
        return False


def inspect(args: argparse.Namespace) -> int:
    info, frames = isolated.call(
        args.data_dir, open_readonly, partial(_frame_list, session=args.session), f"reading session {args.session!r}"
    )
    typed = f", message type {info.message_type}" if info.message_type else ""
    print(
        f"session {info.session_id}: versions {info.first_version}..{info.head_version}, "
        f"{info.stored_bytes} bytes stored{typed}"
    )
    print(f"{'version':>8} {'kind':<6} {'chain':>5} {'base':>8} {'stored':>9} {'state':>10}  created (UTC)")
    depths: dict[int, int] = {}
    for version, vinfo, frame_bytes, base in frames:
        # The frames a version is read through after its chain's FULL frame (a corrupt frame still holds its
        # place in its chain, by its raw kind byte, as verify reads it); a segment's base is an older version.
        depth = depths[version] = 0 if not base else depths.get(base, -1) + 1
        if isinstance(vinfo, DataLoss):
            print(f"{version:>8} CORRUPT {depth:>4} {base or '-':>8} {frame_bytes:>9}  (run `ckpt verify` for details)")
            continue
        print(
            f"{version:>8} {vinfo.frame_kind.name:<6} {depth:>5} {base or '-':>8} {vinfo.stored_bytes:>9} "
            f"{vinfo.state_size:>10}  {utc(vinfo.created_unix_nanos)}"
        )
    return 0


def _frame_list(store: Store, session: str) -> tuple[SessionInfo, list[tuple[int, VersionInfo | DataLoss, int, int]]]:
    """What inspect prints of a session: its record and each version's info, frame size, and base version (0
    for a FULL or PREFIX frame, which reads no older frame) (each frame read and let go: a session's frames
    are never held at once)."""
    with stored_frames(store.read, store.tables, session) as (info, frames):
        return info, [(version, vinfo, len(frame), _base_of(version, frame)) for version, vinfo, frame in frames]


def _base_of(version: int, frame: bytes) -> int:
    """The version ``frame`` is read on, by its raw bytes: 0 for FULL or PREFIX; a segment's base (codec
    FORMAT.md §14); else the version before."""
    if starts_chain(frame) or is_prefix(frame):
        return 0
    if len(frame) > 3 and frame[2] == 2 and frame[3] == FrameKind.PATCH.value:
        distance = segment_distance(frame)
        if 1 < distance < version:
            return version - distance
    return version - 1


# What the data directory holds. The rest of Store.stats() counts what one
# open store did (commits, cache hits): always zero in this read-only opening.
_ON_DISK_STATS = ("sessions", "versions", "map_size_bytes", "used_bytes")


def stats(args: argparse.Namespace) -> int:
    found = isolated.call(args.data_dir, open_readonly, _on_disk_stats, "reading the store's statistics")
    found["data_mdb_bytes"] = (args.data_dir / "lmdb" / "data.mdb").stat().st_size
    print(json.dumps(found, indent=1, default=str))
    return 0


def _on_disk_stats(store: Store) -> dict[str, Any]:
    everything = store.stats()
    found = {name: everything[name] for name in _ON_DISK_STATS}
    with store.read() as txn:  # as `ckpt sessions` lists them, those of events alone too: a scan
        found["sessions"] = count_sessions(txn, store.tables)
    return found


def backup(args: argparse.Namespace) -> int:
    started = time.monotonic()
    lmdb_dir = (args.data_dir / "lmdb").resolve()
    if args.dest.parent.resolve().is_relative_to(lmdb_dir):
        raise ValueError(f"DEST {args.dest} is inside LMDB's own directory {lmdb_dir}; put the backup elsewhere")
    # A backup stopped by SIGTERM/SIGHUP (timeout, systemd, a closed terminal) removes its partial copy,
    # as ^C does: the exception unwinds through write_backup's cleanup. A SIGHUP ignored at start
    # (`nohup ckpt backup ...`) stays ignored, here and in the copying child (child.py), as `ckpt serve`
    # keeps it (docs/operations.md, Stopping); SIGTERM stops it regardless.
    _stop_on_signals()

    def copy(lmdb_dir: Path) -> tuple[int, int]:
        return isolated.call(
            args.data_dir, open_readonly, partial(copy_with_blobs, lmdb_dir=lmdb_dir), f"copying it into {args.dest}"
        )

    result = write_backup(args.dest, copy)
    summary = {
        "backup": str(result.path),
        "sessions": result.sessions,
        "versions": result.versions,
        "data_mdb_bytes": result.data_mdb_bytes,
        "seconds": round(time.monotonic() - started, 3),
    }
    print(json.dumps(summary))
    return 0


def compact(args: argparse.Namespace) -> int:
    started = time.monotonic()
    _stop_on_signals()  # as a backup: its copy removed, the store as it was
    data_dir: Path = args.data_dir

    def copy(lmdb_dir: Path) -> tuple[int, int]:
        return isolated.call(data_dir, open_readonly, partial(_copy, lmdb_dir=lmdb_dir), "making its compacted copy")

    def count(directory: Path) -> tuple[int, int]:
        return isolated.call(directory, open_readonly, held_counts, "checking the compacted copy")

    result = compact_data_dir(data_dir, copy=copy, count=count)
    summary = {
        "sessions": result.sessions,
        "versions": result.versions,
        "data_mdb_bytes_before": result.data_mdb_bytes_before,
        "data_mdb_bytes_after": result.data_mdb_bytes_after,
        "seconds": round(time.monotonic() - started, 3),
    }
    print(json.dumps(summary))
    return 0


def _copy(store: Store, lmdb_dir: Path) -> tuple[int, int]:
    return store.copy_to(lmdb_dir, rebuilt=True)


def _stop_on_signals() -> None:
    """SIGTERM, and SIGHUP unless ignored at start (`nohup ckpt backup ...`), stop the command as ^C does:
    the exception unwinds through its cleanup."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signum == signal.SIGTERM or signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _exit_on_signal)


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
