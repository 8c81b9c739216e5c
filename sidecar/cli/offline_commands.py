"""The commands that read a data directory themselves, read-only: inspect, stats, backup (verify: verify_command.py).

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
from ..config import StoreConfig
from ..errors import DataLoss
from ..store import SessionInfo, Store, VersionInfo, count_sessions, stored_frames
from ..store.prefixes import is_prefix
from ..tools import isolated, write_backup
from ..tools.backup import copy_with_blobs
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
    print(f"{'version':>8} {'kind':<6} {'chain':>5} {'stored':>9} {'state':>10}  created (UTC)")
    depth = 0
    for version, vinfo, frame_bytes, full in frames:
        # A corrupt frame still holds its place in its chain (by its raw kind byte, as verify reads it).
        depth = 0 if full else depth + 1
        if isinstance(vinfo, DataLoss):
            print(f"{version:>8} CORRUPT {depth:>4} {frame_bytes:>9}  (run `ckpt verify` for details)")
            continue
        print(
            f"{version:>8} {vinfo.frame_kind.name:<6} {depth:>5} {vinfo.stored_bytes:>9} "
            f"{vinfo.state_size:>10}  {utc(vinfo.created_unix_nanos)}"
        )
    return 0


def _frame_list(store: Store, session: str) -> tuple[SessionInfo, list[tuple[int, VersionInfo | DataLoss, int, bool]]]:
    """What inspect prints of a session: its record and each version's info, frame size, and whether it is FULL
    or PREFIX (depth 0: it reads no older frame) (each frame read and let go: a session's frames are never held
    at once)."""
    with stored_frames(store.read, store.tables, session) as (info, frames):
        return info, [
            (version, vinfo, len(frame), starts_chain(frame) or is_prefix(frame)) for version, vinfo, frame in frames
        ]


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
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signum == signal.SIGTERM or signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _exit_on_signal)

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


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
