"""Ctrl-C (a KeyboardInterrupt in the main thread) at any point of a sync put_blob, get_blob or get_blob_to
leaves the client usable: its next calls succeed at once on the same client and close() is quick. A put_blob
cut off before its file's end was read stores nothing and leaves no partly written file in the sidecar. Run
in a process of its own, which SIGINTs itself from a timer thread."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support import ROOT, Sidecar

_SCRIPT = r"""
import faulthandler, hashlib, io, os, pathlib, random, signal, sys, threading, time
from ckpt.sidecar.client import CheckpointClient, NotFoundError

target, tmp_dir, how, rounds = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
faulthandler.dump_traceback_later(100, exit=True)  # a hang shows where it hangs
random.seed(int(sys.argv[5]))
CHUNK = 64 * 1024


class Source(io.RawIOBase):
    # A blob's file, read a chunk at a time. Its end is read a while after its last bytes: a Ctrl-C that
    # comes before the end was read ends the put_blob before it could send its end.
    def __init__(self, data):
        self.data, self.at, self.ended = memoryview(data), 0, False

    def readable(self):
        return True

    def read(self, size=-1):
        piece = bytes(self.data[self.at : self.at + size])
        self.at += len(piece)
        if not piece:
            time.sleep(0.2)
            self.ended = True
        return piece


source = None
seen_end = False


def on_sigint(*_):
    global seen_end
    seen_end = source is not None and source.ended
    raise KeyboardInterrupt


def left_parts():
    # A partly written blob, gone once the sidecar has seen its stream end.
    deadline = time.monotonic() + 5
    while (parts := list(tmp_dir.glob("*.part"))) and time.monotonic() < deadline:
        time.sleep(0.01)
    return parts


signal.signal(signal.SIGINT, on_sigint)
client = CheckpointClient(target, timeout_seconds=10)
stored = os.urandom(4 * 1024 * 1024)
ref = client.put_blob(stored, session_id="s", chunk_size_bytes=CHUNK)
interrupted = cut = 0
for i in range(rounds):
    data = os.urandom(4 * 1024 * 1024) if how == "put_blob" else stored
    source = Source(data) if how == "put_blob" else None
    timer = threading.Timer(random.uniform(0, 0.02), os.kill, (os.getpid(), signal.SIGINT))
    try:
        try:
            timer.start()
            if how == "put_blob":
                client.put_blob(source, session_id="s", chunk_size_bytes=CHUNK)
            elif how == "get_blob":
                assert b"".join(client.get_blob(ref)) == data
            else:
                into = io.BytesIO()
                client.get_blob_to(ref, into)
                assert into.getvalue() == data
        finally:
            timer.join()
    except KeyboardInterrupt:
        interrupted += 1
        if how == "put_blob" and not seen_end:
            cut += 1
            parts = left_parts()
            assert not parts, f"round {i}: a put_blob cut off left {parts}"
            try:
                client.get_blob(hashlib.sha256(data).hexdigest()).__next__()
            except NotFoundError:
                pass
            else:
                raise AssertionError(f"round {i}: a put_blob cut off before its end stored the blob")
    started = time.monotonic()
    assert b"".join(client.get_blob(ref)) == stored
    small = client.put_blob(b"round %d" % i, session_id="s")
    assert b"".join(client.get_blob(small)) == b"round %d" % i
    client.put("s", b"state %d" % i)
    assert client.get("s").state == b"state %d" % i
    assert time.monotonic() - started < 5, f"round {i}: the next calls took {time.monotonic() - started:.1f} s"
started = time.monotonic()
client.close()
assert time.monotonic() - started < 2, f"close() took {time.monotonic() - started:.1f} s"
print("interrupted", interrupted, "cut", cut, "of", rounds)
"""


@pytest.mark.parametrize("how", ["put_blob", "get_blob", "get_blob_to"])
def test_the_same_client_goes_on_after_ctrl_c_during_a_blob_transfer(sidecar: Sidecar, how: str) -> None:
    tmp_dir = sidecar.data_dir / "blobs" / "tmp"
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, sidecar.unix_target, str(tmp_dir), how, "150", "11"],
        capture_output=True,
        cwd=ROOT,
        timeout=200,
    )
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()[-4000:]
    words = out.split()
    interrupted, cut = int(words[1]), int(words[3])
    assert interrupted > 100, out  # most rounds were cut by the Ctrl-C, at every stage of the calls
    if how == "put_blob":
        assert cut > 50, out  # most of them before the blob's end was read
