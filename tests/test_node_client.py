"""The contract works from another language with nothing but proto/: a Node.js
client (@grpc/grpc-js + @grpc/proto-loader) against a real sidecar."""

from __future__ import annotations

import json
import shutil
import signal
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
    # The client had no fork, sessions or delete. The second run also lists the first's session
    # (its fork deleted), page by page (page_size 1), with a label and a time filter.
    for n, out in enumerate(results.values()):
        assert out["fork"] == {"session_id": f"node-{n}-fork", "head": 1, "from": 1}
        assert out["sessions"] == [f"node-{i}" for i in range(n)] + [f"node-{n}", f"node-{n}-fork"]
        assert out["sessions_later"] == []
        assert out["deleted"] == 1
        assert out["delete_again"] == 5  # NOT_FOUND, not retried


# One write from Node, printed as JSON: its result, or its error's code and requestId.
_PUT_ONCE = """
const { CheckpointClient } = require(process.argv[1]);
const [target, session, timeoutMs, requestId] = process.argv.slice(2);
const client = new CheckpointClient(target, { timeoutMs: Number(timeoutMs) });
client.put(session, Buffer.from([0x08, 0x01]), { requestId }).then(
  (r) => console.log(JSON.stringify({ version: r.version, replayed: r.replayed })),
  (e) => console.log(JSON.stringify({ code: e.code, requestId: e.requestId || null })),
).finally(() => client.close());
"""


def _node_put(target: str, session: str, *, timeout_ms: int, request_id: str = "") -> subprocess.Popen[str]:
    node = shutil.which("node")
    assert node, "node is not installed"
    args = [node, "-e", _PUT_ONCE, str(NODE_CLIENT / "ckpt_client.js"), target, session, str(timeout_ms), request_id]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _answer(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return dict(json.loads(out))


def test_node_client_outlasts_a_restart_and_bounds_a_call_by_its_timeout(tmp_path: Path) -> None:
    # The client had neither: a put to a stopped sidecar failed at once (with no request id to resend
    # it by), and one to a hung sidecar waited forever.
    socket_path = tmp_path / "late.sock"
    early = _node_put(f"unix:{socket_path}", "restart", timeout_ms=20_000)  # nothing listens yet
    sidecar = start_sidecar(tmp_path / "data", socket_path=socket_path)
    try:
        assert _answer(early) == {"version": 1, "replayed": False}
        sidecar.process.send_signal(signal.SIGSTOP)  # hung: accepts nothing, answers nothing
        try:
            hung = _answer(_node_put(sidecar.unix_target, "hung", timeout_ms=1000, request_id="n-1"))
        finally:
            sidecar.process.send_signal(signal.SIGCONT)
        assert hung == {"code": 4, "requestId": "n-1"}  # DEADLINE_EXCEEDED, with the id to resend by
        resent = _answer(_node_put(sidecar.unix_target, "hung", timeout_ms=20_000, request_id="n-1"))
        assert resent["version"] == 1  # written once, whether the first attempt reached the writer or not
    finally:
        assert sidecar.stop() == 0
