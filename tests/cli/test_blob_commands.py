"""`ckpt blob put` and `ckpt blob get`, run as a user runs them."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from tests.support import Sidecar, ckpt


def test_blob_put_prints_a_ref_and_blob_get_reads_it_back_whole_or_a_range(sidecar: Sidecar, tmp_path: Path) -> None:
    t = ("--target", sidecar.unix_target)
    data = os.urandom(2 * 1024 * 1024 + 5)
    src = tmp_path / "shot.png"
    src.write_bytes(data)
    put = ckpt("blob", "put", "cli", str(src), "--media-type", "image/png", *t)
    assert put.returncode == 0, put.stderr
    ref = json.loads(put.stdout)
    sha = hashlib.sha256(data).hexdigest()
    assert ref == {
        "uri": f"ckpt-blob:sha256:{sha}",
        "content_hash": f"sha256:{sha}",
        "size_bytes": str(len(data)),
        "media_type": "image/png",
    }
    assert ckpt("blob", "get", ref["uri"], *t).stdout == data
    out = tmp_path / "back.png"
    got = ckpt("blob", "get", f"sha256:{sha}", "-o", str(out), *t)
    assert got.returncode == 0 and out.read_bytes() == data
    assert f"{len(data)} bytes -> {out}".encode() in got.stderr
    assert ckpt("blob", "get", sha, "--offset", "7", "--length", "9", *t).stdout == data[7:16]
    piped = ckpt("blob", "put", "cli", "-", *t, stdin=b"from stdin")
    assert json.loads(piped.stdout)["size_bytes"] == "10"


def test_blob_commands_refuse_a_bad_command_line_and_name_a_missing_blob(sidecar: Sidecar, tmp_path: Path) -> None:
    t = ("--target", sidecar.unix_target)
    bad_ref = ckpt("blob", "get", "not-a-hash", *t)
    assert bad_ref.returncode == 2 and b"names no blob" in bad_ref.stderr
    no_file = ckpt("blob", "put", "cli", *t)
    assert no_file.returncode == 2 and b"needs SESSION and FILE" in no_file.stderr
    missing = ckpt("blob", "get", "0" * 64, "-o", str(tmp_path / "x"), *t)
    assert missing.returncode == 1 and b"does not exist" in missing.stderr
    assert not (tmp_path / "x").exists() and not (tmp_path / "x.partial").exists()
