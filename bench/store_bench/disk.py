"""Disk use of a filled store: the data file against the frames it holds, per table, and after interleaved writes."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import lmdb

from ...sidecar import Store, StoreConfig
from ...sidecar.tools.compact import compact
from .common import fresh_dir
from .scale_data import VERSIONS_PER_SESSION, ScaleData


def disk_use(store: Store, frames_bytes: int, sessions: int) -> dict[str, Any]:
    st = os.stat(store.config.data_dir / "lmdb" / "data.mdb")
    return {
        "frames_bytes": frames_bytes,
        "file_bytes": st.st_size,
        "allocated_bytes": st.st_blocks * 512,
        "lmdb_used_bytes": store.stats()["used_bytes"],
        "file_vs_frames": st.st_size / frames_bytes,
        "allocated_vs_frames": st.st_blocks * 512 / frames_bytes,
        "file_bytes_per_session": st.st_size / sessions,
        "frames_bytes_per_session": frames_bytes / sessions,
    }


def lmdb_tables(lmdb_dir: Path) -> dict[str, Any]:
    """Page counts per table of a closed store (read-only), to see where the file's bytes go."""
    env = lmdb.open(str(lmdb_dir), readonly=True, max_dbs=8, subdir=True, lock=False)
    try:
        info, main = env.info(), env.stat()
        out: dict[str, Any] = {"page_size": main["psize"], "last_pgno": info["last_pgno"], "tables": {}}
        in_use = 2 + main["branch_pages"] + main["leaf_pages"] + main["overflow_pages"]  # 2 meta pages
        with env.begin() as txn:
            for name in (b"frames", b"sessions", b"updated", b"requests", b"req_expiry", b"labels"):
                s = txn.stat(env.open_db(name, txn=txn, create=False))
                pages = s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"]
                in_use += pages
                out["tables"][name.decode()] = {
                    "entries": s["entries"],
                    "depth": s["depth"],
                    "leaf_pages": s["leaf_pages"],
                    "overflow_pages": s["overflow_pages"],
                    "bytes": pages * s["psize"],
                }
        out["free_or_unused_pages"] = info["last_pgno"] + 1 - in_use
        return out
    finally:
        env.close()


def interleaved_fill(
    root: Path, data: ScaleData, sessions: int, *, active: int, batch_writes: int, seed: int = 1
) -> dict[str, Any]:
    """Disk use when sessions overlap in time: the same writes as the scale fill, in another order.

    Sessions start in id order and at most ``active`` are open at once; each
    ``put_many`` takes ``batch_writes`` next versions of randomly drawn open
    sessions, so writes land all over the frames table, as when many agents
    run side by side, instead of being appended in key order.
    """
    rng = random.Random(seed)
    directory = fresh_dir(root, "scale-interleaved")
    frames_bytes = 0
    next_version = [1] * sessions
    open_sessions: list[int] = []
    started = 0
    try:
        with Store(StoreConfig(data_dir=directory, cache_size_bytes=0)) as store:
            while started < sessions or open_sessions:
                while len(open_sessions) < active and started < sessions:
                    open_sessions.append(started)
                    started += 1
                batch = []
                for _ in range(min(batch_writes, len(open_sessions))):
                    k = rng.randrange(len(open_sessions))
                    i = open_sessions[k]
                    batch.append(data.request(i, next_version[i]))
                    next_version[i] += 1
                    if next_version[i] > VERSIONS_PER_SESSION:
                        open_sessions[k] = open_sessions[-1]
                        open_sessions.pop()
                for res in store.put_many(batch):  # a session drawn twice keeps its order
                    if isinstance(res, Exception):
                        raise res
                    frames_bytes += res.stored_bytes
            sample = rng.sample(range(sessions), min(sessions, 1000))
            mismatches = sum(store.get(data.session_id(i)).state != data.state(i, VERSIONS_PER_SESSION) for i in sample)
            disk = disk_use(store, frames_bytes, sessions)
            stats = store.stats()
        tables = lmdb_tables(directory / "lmdb")
        # What `ckpt compact` makes of it once the store is closed (the close folds quiet sessions first).
        compacted = compact(directory)
        return {
            "sessions": sessions,
            "active": active,
            "batch_writes": batch_writes,
            "versions": stats["versions"],
            "heads_checked": len(sample),
            "mismatches": mismatches,
            "disk": disk,
            "lmdb": tables,
            "compacted": {
                "file_bytes_before": compacted.data_mdb_bytes_before,
                "file_bytes": compacted.data_mdb_bytes_after,
                "file_vs_frames": compacted.data_mdb_bytes_after / frames_bytes,
            },
        }
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def render_interleaved(r: dict[str, Any]) -> str:
    d, frames_table, c = r["disk"], r["lmdb"]["tables"]["frames"], r["compacted"]
    return (
        f"\nthe same writes interleaved (reported, not checked): {r['sessions']:,} sessions, {r['active']:,} open at "
        f"once, each put_many {r['batch_writes']:,} next versions of randomly drawn open sessions: data.mdb "
        f"**{d['file_vs_frames']:.3f}x** the frames ({d['file_bytes_per_session']:,.0f} against "
        f"{d['frames_bytes_per_session']:,.0f} B per session; the frames table alone "
        f"{frames_table['bytes'] / d['frames_bytes']:.3f}x): inserts landing mid-page split LMDB's pages in half. "
        f"{r['versions']:,} versions; {r['mismatches']} wrong of {r['heads_checked']:,} heads read back. "
        f"Closed (which folds quiet sessions) and compacted (`ckpt compact`: each table written again in key "
        f"order): data.mdb {c['file_bytes_before']:,} -> {c['file_bytes']:,} B, **{c['file_vs_frames']:.3f}x** the"
        " frames written"
    )
