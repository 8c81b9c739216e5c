"""The sync client's unary calls from the main thread run on it, under a SIGINT guard: no hand-off to a worker
thread (two wake-ups a call) unless the program installed a SIGINT handler of its own. Ctrl-C at any point of
a call is tests/client/test_interrupted_sync_calls.py's."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pytest

from ckpt.sidecar.client.interrupts import _HeldSigint
from tests.support import ROOT, Sidecar

_SCRIPT = r"""
import signal, sys, threading
from ckpt.sidecar.client import CheckpointClient

if sys.argv[2] == "own":
    signal.signal(signal.SIGINT, lambda *_: None)
before = signal.getsignal(signal.SIGINT)
with CheckpointClient(sys.argv[1]) as client:
    client.put("s", b"state")
    assert client.get("s").state == b"state"
    handler_kept = signal.getsignal(signal.SIGINT) is before
    workers = [t.name for t in threading.enumerate() if t.name == "ckpt-grpc-steps"]
print(handler_kept, len(workers))
"""


@pytest.mark.parametrize(("handler", "workers"), [("python", 0), ("own", 1)])
def test_a_unary_call_goes_to_the_worker_only_under_a_programs_own_sigint_handler(
    sidecar: Sidecar, handler: str, workers: int
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, sidecar.unix_target, handler], capture_output=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert done.stdout.split() == [b"True", str(workers).encode()]


def test_the_guard_holds_a_sigint_landing_in_a_locks_python_code_and_raises_anywhere_else() -> None:
    frames = []

    class Lock:  # a Condition's lock: its __enter__ is called from threading's Condition.__enter__
        def __enter__(self) -> bool:
            frames.append(sys._getframe(1))
            return True

        def __exit__(self, *_: object) -> None:
            return None

        def acquire(self, *_: object) -> bool:
            return True

        def release(self) -> None:
            return None

    with threading.Condition(Lock()):  # type: ignore[arg-type]
        pass
    assert frames[0].f_globals["__name__"] == "threading"
    guard = _HeldSigint()
    guard(signal.SIGINT, frames[0])
    assert guard.held
    other = _HeldSigint()
    with pytest.raises(KeyboardInterrupt):
        other(signal.SIGINT, sys._getframe())
    assert not other.held
