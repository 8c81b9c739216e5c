"""What another frames-table layout would make of the interleaved fill's disk use, replayed.

    python -m ckpt.bench.store_bench.layouts [--sessions N] [--data-dir DIR]

The scale run's interleaved fill (disk.interleaved_fill: sessions open at once, each ``put_many`` the next
versions of randomly drawn ones) leaves data.mdb about 2.25x the frames it holds: each session's next
frame lands mid-page among other sessions' keys, and LMDB splits a page in half when it fills. A frames
table written in commit order, with a (session, version) index beside it, fills its pages. Whether that
would bring the file near the frames is measured here rather than argued: the store makes the fill, its
stored values are read back, and the same values are written again in the same transactions (the writer's,
``max_batch_writes`` at most each) into two plain LMDB files, one keyed as the store keys frames and one in
commit order (keys appended, so LMDB fills each page) with the index. Only the frames and the session
records are replayed, not the store's other tables: the replay of the store's own layout says how far the
rest takes the file.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import struct
from pathlib import Path
from typing import Any

import lmdb

from ...sidecar import Store, StoreConfig
from .common import data_root, fresh_dir
from .scale_data import VERSIONS_PER_SESSION, ScaleData

_SEQ = struct.Struct(">Q")
LAYOUTS = ("keyed", "append-ordered")


#: Each put_many's (session, version) writes, in order.
Writes = list[list[tuple[int, int]]]


def _fill(directory: Path, data: ScaleData, sessions: int, batch_writes: int) -> tuple[Writes, int, int]:
    """The interleaved fill (as disk.interleaved_fill makes it, every session open at once): its writes, the
    frame bytes stored, and data.mdb's size before the close (which folds, as the fill's figure is taken)."""
    rng = random.Random(1)
    next_version = [1] * sessions
    open_sessions: list[int] = []
    started = frames_bytes = 0
    batches: Writes = []
    with Store(StoreConfig(data_dir=directory, cache_size_bytes=0)) as store:
        while started < sessions or open_sessions:
            while started < sessions:
                open_sessions.append(started)
                started += 1
            order: list[tuple[int, int]] = []
            for _ in range(min(batch_writes, len(open_sessions))):
                k = rng.randrange(len(open_sessions))
                i = open_sessions[k]
                order.append((i, next_version[i]))
                next_version[i] += 1
                if next_version[i] > VERSIONS_PER_SESSION:
                    open_sessions[k] = open_sessions[-1]
                    open_sessions.pop()
            for res in store.put_many([data.request(i, v) for i, v in order]):
                if isinstance(res, Exception):
                    raise res
                frames_bytes += res.stored_bytes
            batches.append(order)
        file_bytes = os.path.getsize(directory / "lmdb" / "data.mdb")
    return batches, frames_bytes, file_bytes


def _replay(
    directory: Path, layout: str, commits: list[list[tuple[bytes, bytes, bytes]]], sessions: dict[bytes, bytes]
) -> dict[str, Any]:
    """Write each commit's (session key, frame key, value) into a fresh LMDB file laid out as ``layout``."""
    shutil.rmtree(directory, ignore_errors=True)
    env = lmdb.open(str(directory), map_size=1 << 36, max_dbs=4, sync=False, metasync=False)
    try:
        frames, index, records = env.open_db(b"frames"), env.open_db(b"index"), env.open_db(b"sessions")
        seq = 0
        for commit in commits:
            with env.begin(write=True) as txn:
                for sid, key, value in commit:
                    if layout == "keyed":
                        txn.put(key, value, db=frames)
                    else:
                        seq += 1
                        txn.put(_SEQ.pack(seq), value, db=frames, append=True)
                        txn.put(key, _SEQ.pack(seq), db=index)
                    txn.put(sid, sessions[sid], db=records)
        with env.begin() as txn:
            pages = {
                name.decode(): sum(txn.stat(db)[k] for k in ("branch_pages", "leaf_pages", "overflow_pages"))
                for name, db in ((b"frames", frames), (b"index", index), (b"sessions", records))
            }
        page_size = env.stat()["psize"]
    finally:
        env.close()
    return {
        "file_bytes": os.path.getsize(directory / "data.mdb"),
        "table_bytes": {k: v * page_size for k, v in pages.items()},
    }


def replay_layouts(
    root: Path, sessions: int = 20_000, *, batch_writes: int = 667 * VERSIONS_PER_SESSION
) -> dict[str, Any]:
    """The interleaved fill's data.mdb, and the same frames replayed in each of LAYOUTS, against the frames."""
    data = ScaleData(width=max(8, len(str(sessions - 1)) + 1))
    store_dir = fresh_dir(root, "layouts-store")
    try:
        batches, frames_bytes, store_file = _fill(store_dir, data, sessions, batch_writes)
        env = lmdb.open(str(store_dir / "lmdb"), max_dbs=16, readonly=True, lock=False)
        try:
            with env.begin() as txn:
                values = dict(txn.cursor(db=env.open_db(b"frames", txn=txn, create=False)))
                records = dict(txn.cursor(db=env.open_db(b"sessions", txn=txn, create=False)))
        finally:
            env.close()
        per_txn = StoreConfig(data_dir=store_dir).max_batch_writes
        commits = []
        for order in batches:
            writes = []
            for i, v in order:
                sid = data.session_id(i).encode()
                key = sid + b"\x00" + _SEQ.pack(v)
                writes.append((sid, key, values[key]))
            commits += [writes[k : k + per_txn] for k in range(0, len(writes), per_txn)]
        out: dict[str, Any] = {
            "sessions": sessions,
            "frames_bytes": frames_bytes,
            "writes_per_transaction": per_txn,
            "store_file_vs_frames": store_file / frames_bytes,
        }
        for layout in LAYOUTS:
            got = _replay(root / f"layouts-{layout}", layout, commits, records)
            out[layout] = {
                "file_vs_frames": got["file_bytes"] / frames_bytes,
                "tables_vs_frames": {k: v / frames_bytes for k, v in got["table_bytes"].items()},
            }
        return out
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)
        for layout in LAYOUTS:
            shutil.rmtree(root / f"layouts-{layout}", ignore_errors=True)


def render(r: dict[str, Any]) -> str:
    lines = [
        f"interleaved fill of {r['sessions']:,} sessions: the store's data.mdb {r['store_file_vs_frames']:.3f}x the"
        f" frames; the same values and commits ({r['writes_per_transaction']} writes at most each) replayed:",
        "",
        "| frames table | data.mdb x frames | frames table | index | session records |",
        "|---|---:|---:|---:|---:|",
    ]
    for layout in LAYOUTS:
        t = r[layout]["tables_vs_frames"]
        cells = [r[layout]["file_vs_frames"], t["frames"], t["index"], t["sessions"]]
        lines.append(f"| {layout} | " + " | ".join(f"{x:.3f}x" for x in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m ckpt.bench.store_bench.layouts", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--sessions", type=int, default=20_000)
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args(argv)
    print(render(replay_layouts(data_root(args.data_dir), args.sessions)))


if __name__ == "__main__":
    main()
