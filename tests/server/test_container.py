"""Docker cannot run here; what can be tested is that the image runs exactly the
`ckpt serve` the other tests run, configured by its environment, and that its
health check works against it."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from ckpt.sidecar.server import wait_until_serving
from tests.support import ROOT, free_port


def dockerfile() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.setdefault(word, []).append(rest.strip())
    return out


def test_image_runs_ckpt_serve_from_its_environment(tmp_path: Path) -> None:
    d = dockerfile()
    assert json.loads(d["ENTRYPOINT"][0]) == ["ckpt"] and json.loads(d["CMD"][0]) == ["serve"]
    assert d["USER"] == ["ckpt"]  # not root
    assert set(json.loads(d["VOLUME"][0])) == {"/data", "/run/ckpt"}
    for copy in d["COPY"]:
        assert (ROOT / copy.split()[0]).exists(), copy
    env = dict(part.split("=", 1) for part in shlex.split(d["ENV"][0]))
    assert env["CKPT_DATA_DIR"] == "/data" and env["CKPT_LISTEN"].startswith("unix:/run/ckpt/ckpt.sock,")
    # `docker exec ... ckpt get` finds the server: the socket is not in the data directory.
    assert env["CKPT_TARGET"] == env["CKPT_LISTEN"].split(",")[0]
    # Metrics, once given a port, are reachable from outside the container.
    assert env["CKPT_METRICS_ADDRESS"] == "0.0.0.0"
    # The same environment, pointed at this machine's temporary paths.
    sock, port, metrics_port = tmp_path / "ckpt.sock", free_port(), free_port()
    run_env = {
        **os.environ,
        "CKPT_DATA_DIR": str(tmp_path / "data"),
        "CKPT_LISTEN": f"unix:{sock},127.0.0.1:{port}",
        "CKPT_METRICS_ADDRESS": env["CKPT_METRICS_ADDRESS"],
        "CKPT_METRICS_PORT": str(metrics_port),
    }
    ckpt = Path(sys.executable).with_name("ckpt")  # the console script pyproject installs
    proc = subprocess.Popen([str(ckpt), "serve"], env=run_env, stderr=subprocess.PIPE, text=True)
    try:
        wait_until_serving(f"unix:{sock}", 30)
        wait_until_serving(f"127.0.0.1:{port}", 30)
        health = json.loads(d["HEALTHCHECK"][0].split("CMD", 1)[1])
        health = [sys.executable if a == "python" else a.replace("/run/ckpt/ckpt.sock", str(sock)) for a in health]
        assert subprocess.run(health, timeout=30).returncode == 0
        client_env = {**run_env, "CKPT_TARGET": env["CKPT_TARGET"].replace("/run/ckpt/ckpt.sock", str(sock))}
        put = subprocess.run([str(ckpt), "put", "s"], input=b"state", env=client_env, capture_output=True, timeout=30)
        assert put.returncode == 0, put.stderr
        # 127.0.0.2 reaches only a socket bound to every address.
        scraped = urllib.request.urlopen(f"http://127.0.0.2:{metrics_port}/metrics", timeout=10).read()
        assert b"ckpt_commits_total 1.0" in scraped
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f"listen=unix:{sock},127.0.0.1:{port} data_dir={tmp_path / 'data'}" in err
    assert f"metrics=0.0.0.0:{metrics_port} pid=" in err
