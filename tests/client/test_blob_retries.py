"""Both clients retry a blob read the sidecar could not start (it is restarting, a connection attempt was
cut) as they retry a unary read, until its first chunk reaches the caller; a read cut after that is raised,
never sent again, since the caller already holds part of the blob."""

from __future__ import annotations

import io
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ckpt.sidecar.client import CheckpointClient, CheckpointError
from tests.client.support import FLAVOURS, open_client
from tests.support import Sidecar, start_sidecar

MIB = 1024 * 1024
# Retries waiting ~16 s in all: a restart outlasts them even on a loaded machine.
_RETRIES = 20


def _socket_path(sidecar: Sidecar) -> Path:
    return Path(sidecar.unix_target.removeprefix("unix:"))


def _read(client: Any, ref: Any, how: str) -> bytes:
    if how == "get_blob":
        return b"".join(client.get_blob(ref))
    into = io.BytesIO()
    assert client.get_blob_to(ref, into) == len(into.getvalue())
    return into.getvalue()


def _read_across_a_start(
    client: Any, ref: Any, how: str, data_dir: Path, socket_path: Path
) -> tuple[Sidecar, bytes | CheckpointError]:
    """Read ``ref`` through ``client`` while no sidecar serves, then start one; the sidecar started and
    what the read returned (or raised)."""
    outcome: list[bytes | CheckpointError] = []

    def read() -> None:
        try:
            outcome.append(_read(client, ref, how))
        except CheckpointError as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.3)  # its first attempts find no sidecar
    try:
        started = start_sidecar(data_dir, socket_path=socket_path)
    finally:
        reader.join()
    return started, outcome[0]


@pytest.mark.parametrize("how", ["get_blob", "get_blob_to"])
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_blob_read_while_the_sidecar_is_down_returns_the_blob_once_it_is_started_again(
    tmp_path: Path, flavour: str, how: str
) -> None:
    data = os.urandom(3 * MIB + 17)
    sidecar = start_sidecar(tmp_path / "data")
    with CheckpointClient(sidecar.unix_target) as client:
        ref = client.put_blob(data, session_id="s")
    assert sidecar.stop() == 0, sidecar.log()
    restarted: Sidecar | None = None
    try:
        with open_client(flavour, sidecar.unix_target, retries=_RETRIES) as c:
            restarted, outcome = _read_across_a_start(c, ref, how, tmp_path / "data", _socket_path(sidecar))
        assert isinstance(outcome, bytes), outcome
        assert outcome == data
    finally:
        if restarted is not None:
            assert restarted.stop() == 0, restarted.log()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_blob_read_cut_after_its_first_chunk_is_raised_and_a_new_read_returns_the_blob(
    tmp_path: Path, flavour: str
) -> None:
    """Small chunks (the sidecar's smallest message limit), so the stream is long: the sidecar is killed
    with most of it unsent. A new stream would send again the bytes the caller holds, so the failure is
    raised at once, not retried; reading again (as the caller then does) is, across the restart."""
    data = os.urandom(32 * MIB)
    sidecar = start_sidecar(tmp_path / "data", "--max-message-bytes", str(128 * 1024))
    restarted: Sidecar | None = None
    try:
        with CheckpointClient(sidecar.unix_target) as client:
            ref = client.put_blob(data, session_id="s", chunk_size_bytes=64 * 1024)
        with open_client(flavour, sidecar.unix_target, retries=_RETRIES) as c:
            chunks = c.get_blob(ref)
            got = [next(chunks)]
            sidecar.stop(signal.SIGKILL)
            began = time.monotonic()
            with pytest.raises(CheckpointError) as info:
                got.extend(chunks)
            # Raised as the stream broke: a resent stream would have met no sidecar and given up after the
            # retries (~16 s, "gave up after 21 attempts").
            assert "gave up" not in str(info.value) and time.monotonic() - began < 5, info.value
            held = b"".join(got)
            assert 0 < len(held) < len(data) and data.startswith(held)
            restarted, outcome = _read_across_a_start(c, ref, "get_blob", tmp_path / "data", _socket_path(sidecar))
        assert isinstance(outcome, bytes), outcome
        assert outcome == data
    finally:
        if restarted is not None:
            assert restarted.stop() == 0, restarted.log()
        else:
            sidecar.stop(signal.SIGKILL)
