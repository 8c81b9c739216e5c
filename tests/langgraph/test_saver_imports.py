"""A saver on a sidecar (``CkptSaver("unix:...")``) loads no store engine, codec encoder or decoder, nor
LMDB, however it is used; ``CkptSaver.embedded`` loads the engine when it is called."""

from __future__ import annotations

from pathlib import Path

from tests.support import Sidecar, engine_modules, run_fresh

#: A checkpoint written and read back, and the thread's list, by the saver sys.argv[1] says how to make.
_SAVE_AND_READ = """
from langgraph.checkpoint.base import empty_checkpoint
from ckpt.sidecar.langgraph import CkptSaver
how, where = sys.argv[1:3]
saver = CkptSaver(where) if how == "sidecar" else CkptSaver.embedded(where)
with saver:
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    checkpoint.update(channel_values={"n": 1}, channel_versions={"n": 1})
    head = saver.put(config, checkpoint, {"source": "loop", "step": 0, "parents": {}}, {"n": 1})
    assert saver.get_tuple(head).checkpoint["channel_values"] == {"n": 1}
    assert len(list(saver.list(config))) == 1
    print("read back")
"""


def test_a_saver_on_a_sidecar_loads_no_store_engine(sidecar: Sidecar) -> None:
    done, modules = run_fresh(_SAVE_AND_READ, "sidecar", sidecar.unix_target)
    assert done.stdout == b"read back\n", done.stderr.decode()
    assert "ckpt.sidecar.langgraph.savers" in modules
    assert engine_modules(modules) == []


def test_an_embedded_saver_loads_the_store_engine_when_made(tmp_path: Path) -> None:
    done, modules = run_fresh(_SAVE_AND_READ, "embedded", str(tmp_path / "data"))
    assert done.stdout == b"read back\n", done.stderr.decode()
    assert {"ckpt.sidecar.store.engine", "ckpt.sidecar.langgraph.storebackend", "lmdb"} <= modules
