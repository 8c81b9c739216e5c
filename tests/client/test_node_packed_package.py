"""The Node.js client as npm installs it from its tarball (``npm pack``), away from the repository: it carries
the .proto files it loads (the service, the tool cache's Checkpoint, the LangGraph.js saver's records) and
works against a real sidecar.

The tarball is packed from a copy of the repository's proto/ and clients/node, so packing leaves nothing in
the checkout; it is installed into a fresh project from the npm cache ``make install`` filled where it can
be (``--prefer-offline``): an install from package-lock.json fetches the packages' tarballs but not the
registry documents a project without a lockfile resolves them by, so a fresh machine's cache lacks those.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import ROOT, start_sidecar

NODE_CLIENT = ROOT / "clients" / "node"
_NPM = "npm is not installed: `make test` (or .ci/run) installs what the tests need"

_USE = r"""
const { CheckpointClient } = require('ckpt-client');
const { CkptSaver } = require('ckpt-client/langgraph');
const { emptyCheckpoint, uuid6 } = require('@langchain/langgraph-checkpoint');

async function main() {
  const target = process.argv[1];
  const client = new CheckpointClient(target);
  const out = {};
  out.put = (await client.put('packed', Buffer.from([0x08, 0x01]))).version;
  out.get = Buffer.from((await client.get('packed')).state).toString('hex');
  out.tool = await client.cachedCall('packed', 'add', { a: 1, b: 2 }, async () => 3);
  client.close();
  const saver = new CkptSaver(target);
  const config = { configurable: { thread_id: 'graph', checkpoint_ns: '' } };
  const checkpoint = { ...emptyCheckpoint(), id: uuid6(-1), channel_values: { n: 1 }, channel_versions: { n: 1 } };
  const saved = await saver.put(config, checkpoint, { source: 'loop', step: 0, parents: {} }, { n: 1 });
  const tuple = await saver.getTuple(config);
  const sameId = tuple.config.configurable.checkpoint_id === saved.configurable.checkpoint_id;
  out.graph = [sameId, tuple.checkpoint.channel_values];
  saver.close();
  process.stdout.write(JSON.stringify(out));
}

main().catch((err) => { console.error(err); process.exit(1); });
"""


def _run(*args: str, cwd: Path) -> str:
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(args)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def installed_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh npm project with the client's tarball installed; returns its folder."""
    npm = shutil.which("npm")
    assert npm, _NPM
    work = tmp_path_factory.mktemp("packed")
    repository = work / "repository"
    shutil.copytree(ROOT / "proto", repository / "proto")
    not_packed_from = shutil.ignore_patterns("node_modules", "proto")  # a copy `prepare` made: packing makes its own
    shutil.copytree(NODE_CLIENT, repository / "clients" / "node", ignore=not_packed_from)
    tarballs = work / "tarballs"
    tarballs.mkdir()
    _run(npm, "pack", "--loglevel=error", "--pack-destination", str(tarballs), cwd=repository / "clients" / "node")
    [tarball] = tarballs.glob("ckpt-client-*.tgz")
    project = work / "project"
    project.mkdir()
    (project / "package.json").write_text(json.dumps({"name": "uses-ckpt-client", "version": "1.0.0", "private": True}))
    _run(npm, "install", "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error", str(tarball), cwd=project)
    return project


def test_the_packed_package_carries_the_proto_files_of_the_repository(installed_project: Path) -> None:
    packed = installed_project / "node_modules" / "ckpt-client" / "proto"
    originals = sorted(p.relative_to(ROOT / "proto") for p in (ROOT / "proto").rglob("*.proto"))
    assert sorted(p.relative_to(packed) for p in packed.rglob("*.proto")) == originals
    assert all((packed / p).read_bytes() == (ROOT / "proto" / p).read_bytes() for p in originals)


def test_the_installed_package_puts_gets_caches_a_tool_call_and_saves_a_graph_checkpoint(
    installed_project: Path, tmp_path: Path
) -> None:
    node = shutil.which("node")
    assert node, _NPM
    sidecar = start_sidecar(tmp_path / "data")
    try:
        out = json.loads(_run(node, "-e", _USE, sidecar.unix_target, cwd=installed_project))
    finally:
        assert sidecar.stop() == 0
    assert out == {"put": 1, "get": "0801", "tool": 3, "graph": [True, {"n": 1}]}
