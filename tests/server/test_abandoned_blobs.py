"""A sidecar with age retention releases the blobs of a session that never wrote the checkpoint naming them,
and lists that session until then."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ckpt.sidecar.client import CheckpointClient, NotFoundError
from tests.server.test_blobs import blob_files
from tests.support import ckpt, metric, start_sidecar_with_metrics, wait_for_metrics


def test_the_blobs_of_an_agent_that_never_checkpointed_are_listed_then_released_by_age(tmp_path: Path) -> None:
    data = tmp_path / "data"
    sweeping = ("--sweep-interval-seconds", "0.2", "--max-version-age-seconds", "2")
    sidecar = start_sidecar_with_metrics(data, *sweeping)
    try:
        with CheckpointClient(sidecar.unix_target) as c:
            abandoned = c.put_blob(b"an upload whose agent crashed", session_id="abandoned")
            named = c.put_blob(b"an upload its checkpoint names", session_id="working")
            c.put("working", b"state naming " + named.uri.encode())
            listed = {s.session_id: s.head_version for s in c.sessions()}
            assert listed == {"abandoned": 0, "working": 1}
            with pytest.raises(NotFoundError, match="session 'abandoned' has no versions, only blobs"):
                c.get("abandoned")
            with pytest.raises(NotFoundError, match="session 'abandoned' has no versions, only blobs"):
                list(c.history("abandoned"))
            deadline = time.monotonic() + 30
            while [s.session_id for s in c.sessions()] != ["working"]:
                assert time.monotonic() < deadline, sidecar.log()
                time.sleep(0.2)
            with pytest.raises(NotFoundError):
                b"".join(c.get_blob(abandoned.uri))
            # Counted once the sweep that released it ends.
            wait_for_metrics(lambda: metric(sidecar, "ckpt_sweep_blob_refs_released_total") == 1)
            c.put("working", b"state still naming " + named.uri.encode())  # keeps the version naming it
            assert b"".join(c.get_blob(named.uri)) == b"an upload its checkpoint names"
        assert sidecar.stop() == 0, sidecar.log()
    finally:
        sidecar.stop()
    assert [f.name for f in blob_files(data)] == [named.uri.removeprefix("ckpt-blob:sha256:")]
    stats = ckpt("stats", "--data-dir", str(data))
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["sessions"] == 1
