"""Child process for tests/test_store_crash.py: writes until killed.

    python -m tests.store.crash_writer DATA_DIR THREADS

Each thread owns one session and writes versions 1, 2, 3, ... (even threads
REPLACE, odd threads MERGE); after each put returns (= committed), it prints
"ACK session version" and flushes, so the parent knows what was acknowledged.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from ckpt.codec import ChainPolicy
from ckpt.sidecar import NotFound, Store, StoreConfig, WriteMode
from ckpt.v1 import checkpoint_pb2 as pb


def replace_state(session: str, version: int) -> bytes:
    cp = pb.Checkpoint(schema_version=1, step=version, goal=session)
    for i in range(1, version + 1):
        cp.messages.add(content=f"{session} step {i} " + "z" * 80)
    return cp.SerializeToString(deterministic=True)


def merge_patch(session: str, version: int) -> bytes:
    return pb.Checkpoint(step=version, messages=[pb.Message(content=f"{session} patch {version}")]).SerializeToString()


def expected_state(session: str, version: int) -> bytes:
    n = int(session[1:])
    if n % 2 == 0:
        return replace_state(session, version)
    return b"".join(merge_patch(session, v) for v in range(1, version + 1))


def main() -> None:
    data_dir, threads = sys.argv[1], int(sys.argv[2])
    store = Store(StoreConfig(data_dir=Path(data_dir), chain_policy=ChainPolicy(frame_cost_bytes=0, max_depth=6)))
    out = threading.Lock()

    def writer(n: int) -> None:
        session = f"t{n}"
        try:  # continue where an earlier (killed) run stopped
            version = store.session(session).head_version
        except NotFound:
            version = 0
        while True:
            version += 1
            if n % 2 == 0:
                store.put(session, replace_state(session, version))
            else:
                store.put(session, merge_patch(session, version), mode=WriteMode.MERGE)
            with out:
                sys.stdout.write(f"ACK {session} {version}\n")
                sys.stdout.flush()

    for n in range(threads):
        threading.Thread(target=writer, args=(n,), daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    main()
