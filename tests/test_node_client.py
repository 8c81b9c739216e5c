"""The contract works from another language with nothing but proto/: a Node.js
client (@grpc/grpc-js + @grpc/proto-loader) against a real sidecar."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tests.sidecar_proc import ROOT, start_sidecar

NODE_CLIENT = ROOT / "clients" / "node"


def test_node_client_put_merge_get_history_conflict(tmp_path: Path) -> None:
    node = shutil.which("node")
    assert node, "node is not installed: `make test` (or .ci/run) installs what the tests need"
    assert (NODE_CLIENT / "node_modules" / "@grpc" / "grpc-js").is_dir(), (
        "run `make install` (npm install in clients/node)"
    )
    sidecar = start_sidecar(tmp_path / "data")
    try:
        results: dict[str, Any] = {}
        for target in (sidecar.unix_target, sidecar.tcp_target):
            session = f"node-{len(results)}"
            proc = subprocess.run(
                [node, str(NODE_CLIENT / "demo.js"), target, session], capture_output=True, text=True, timeout=60
            )
            assert proc.returncode == 0, proc.stderr
            results[target] = json.loads(proc.stdout)
    finally:
        assert sidecar.stop() == 0
    state = "0801" + "2a046e6f6465"
    for out in results.values():
        assert out["put"] == {"version": 1, "frame_kind": "FRAME_KIND_FULL"}
        assert out["merge"]["version"] == 2
        assert out["get"] == {"version": 2, "state_hex": state + "1002"}
        assert out["get_v1"] == {"version": 1, "state_hex": state}
        assert out["history"] == [
            {"version": 2, "mode": "WRITE_MODE_MERGE", "labels": {}},
            {"version": 1, "mode": "WRITE_MODE_REPLACE", "labels": {"lang": "node"}},
        ]
        assert out["conflict"]["current_version"] == 2
        assert "expected_version 1 but the head is version 2" in out["conflict"]["message"]
