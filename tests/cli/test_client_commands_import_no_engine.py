"""`ckpt get` and the other commands that talk to a sidecar, run as `python -m ckpt` runs them, import
neither the store engine, the server, the tools, the codec's encoder and decoder, nor LMDB: what an agent
shelling out to them pays for at each call. The commands that read a data directory themselves do."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support import Sidecar, agent_file, descriptor_set_of, engine_modules, run_fresh

#: `python -m ckpt ARGS...`, sys.argv as it sets it.
_CKPT = (
    "import runpy\nsys.argv = ['ckpt', *sys.argv[1:]]\nrunpy.run_module('ckpt', run_name='__main__', alter_sys=True)"
)


def _ckpt(*args: str, stdin: bytes = b"") -> tuple[int, bytes, list[str]]:
    """The exit status and output of `ckpt ARGS`, and the engine's modules it had imported when it ended."""
    done, modules = run_fresh(_CKPT, *args, stdin=stdin)
    assert "ckpt.sidecar.cli.main" in modules, done.stderr.decode()
    return done.returncode, done.stdout, engine_modules(modules)


def test_the_commands_that_talk_to_a_sidecar_import_no_store_engine(sidecar: Sidecar, tmp_path: Path) -> None:
    t = ("--target", sidecar.unix_target)
    types = tmp_path / "agent.binpb"
    types.write_bytes(descriptor_set_of(agent_file()))
    blob = tmp_path / "blob.bin"
    blob.write_bytes(b"artifact")
    runs = [
        ("put", "agent-7", *t),
        ("put", "agent-7", "--merge", "--label", "team=red", *t),
        ("get", "agent-7", *t),
        ("history", "agent-7", *t),
        ("sessions", "--label", "team=red", *t),
        ("fork", "agent-7", "agent-8", *t),
        ("events", "agent-7", *t),
        ("register-type", str(types), *t),
        ("blob", "put", "agent-7", str(blob), *t),
        ("delete", "agent-8", *t),
    ]
    for args in runs:
        code, out, engine = _ckpt(*args, stdin=b"\x08\x01")
        assert (code, engine) == (0, []), args
    code, out, engine = _ckpt("get", "agent-7", *t)
    assert (code, out, engine) == (0, b"\x08\x01\x08\x01", [])  # the put, then the merge of the same bytes
    code, out, engine = _ckpt("blob", "get", json.loads(_ckpt("blob", "put", "agent-7", str(blob), *t)[1])["uri"], *t)
    assert (code, out, engine) == (0, b"artifact", [])


def test_a_failing_client_command_imports_no_store_engine(sidecar: Sidecar) -> None:
    code, _, engine = _ckpt("get", "NO-SUCH", "--target", sidecar.unix_target)
    assert (code, engine) == (1, [])
    code, _, engine = _ckpt("get", "bad\x01id", "--target", sidecar.unix_target)  # refused before any call
    assert (code, engine) == (2, [])


def test_the_commands_that_read_a_data_directory_import_the_store(sidecar: Sidecar) -> None:
    code, _, engine = _ckpt("stats", "--data-dir", str(sidecar.data_dir))
    assert code == 0 and "ckpt.sidecar.store.engine" in engine and "lmdb" in engine
