"""Ctrl-C (a KeyboardInterrupt in the main thread) at any point of a sync put_stream or unary call leaves the
client usable: the writes resent with the same request ids on the same client are answered at once, each
written once, and close() is quick. Run in a process of its own, which SIGINTs itself from a timer thread."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support import ROOT, Sidecar

_SCRIPT = r"""
import collections, faulthandler, os, random, signal, sys, threading, time
from ckpt.sidecar.client import CheckpointClient
from ckpt.v1 import checkpoint_pb2, service_pb2

target, how, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
faulthandler.dump_traceback_later(40, exit=True)  # a hang shows where it hangs
random.seed(int(sys.argv[4]))


def state(text):
    return checkpoint_pb2.Checkpoint(messages=[checkpoint_pb2.Message(content=text)]).SerializeToString()


def write(client, session, writes):
    if how == "list":
        results = list(client.put_stream(writes, batch_size=3))
        assert all(r.WhichOneof("outcome") == "response" for r in results), results
    elif how == "generator":
        results = list(client.put_stream((w for w in writes), batch_size=3))
        assert all(r.WhichOneof("outcome") == "response" for r in results), results
    else:
        for w in writes:
            client.merge(session, w.state, request_id=w.request_id)
            client.get(session)


client = CheckpointClient(target, timeout_seconds=10)
session = f"s-{how}"
interrupted = 0
for i in range(rounds):
    writes = [
        service_pb2.PutRequest(
            session_id=session, state=state(f"{i}.{j}"), mode=service_pb2.WRITE_MODE_MERGE, request_id=f"{i}.{j}"
        )
        for j in range(10)
    ]
    timer = threading.Timer(random.uniform(0, 0.01), os.kill, (os.getpid(), signal.SIGINT))
    try:
        try:
            timer.start()
            write(client, session, writes)
        finally:
            timer.join()
    except KeyboardInterrupt:
        interrupted += 1
    started = time.monotonic()
    write(client, session, writes)  # resent: answered as at once
    assert time.monotonic() - started < 5, f"round {i}: the resent writes took {time.monotonic() - started:.1f} s"
contents = collections.Counter(
    m.content for m in checkpoint_pb2.Checkpoint.FromString(client.get(session).state).messages
)
assert sorted(contents) == sorted(f"{i}.{j}" for i in range(rounds) for j in range(10)), contents
assert set(contents.values()) == {1}, [c for c, n in contents.items() if n > 1]
started = time.monotonic()
client.close()
assert time.monotonic() - started < 2, f"close() took {time.monotonic() - started:.1f} s"
print("interrupted", interrupted, "of", rounds)
"""


@pytest.mark.parametrize("how", ["list", "generator", "unary"])
def test_writes_resent_after_ctrl_c_are_answered_once_on_the_same_client(sidecar: Sidecar, how: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, sidecar.unix_target, how, "150", "7"],
        capture_output=True,
        cwd=ROOT,
        timeout=120,
    )
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()[-4000:]
    interrupted = int(out.split()[1])
    assert interrupted > 100, out  # most rounds were cut by the Ctrl-C, at every stage of the calls


_HANDLER_SCRIPT = r"""
import faulthandler, signal, sys, time
from ckpt.sidecar.client import CheckpointClient

faulthandler.dump_traceback_later(40, exit=True)  # a hang shows where it hangs
client = CheckpointClient(sys.argv[1], timeout_seconds=10)
client.put("s", b"state")
in_handler = [0]


def on_alarm(*_):  # a handler that saves or reads, as one on SIGTERM saving a last checkpoint does
    client.get("s")
    in_handler[0] += 1


signal.signal(signal.SIGALRM, on_alarm)
signal.setitimer(signal.ITIMER_REAL, 0.002, 0.002)
began, in_main = time.monotonic(), 0
while time.monotonic() - began < 3:
    client.get("s")
    in_main += 1
signal.setitimer(signal.ITIMER_REAL, 0)
client.close()
print(in_main, in_handler[0])
"""


def test_a_signal_handler_may_call_the_client_while_the_main_thread_is_in_a_call(sidecar: Sidecar) -> None:
    """A handler runs on the main thread between two bytecodes of the call it interrupted: nothing the client
    holds there (a lock of its own) may be needed by the handler's call."""
    done = subprocess.run(
        [sys.executable, "-c", _HANDLER_SCRIPT, sidecar.unix_target], capture_output=True, cwd=ROOT, timeout=90
    )
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()[-4000:]
    in_main, in_handler = map(int, done.stdout.split())
    assert in_main > 100 and in_handler > 100, done.stdout
