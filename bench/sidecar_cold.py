"""The cold Get: every session's latest version read once by a sidecar just restarted, against an echo of its bytes.

What an agent resuming after a pause meets: the server process is new (no reply
cache, no decoded state), the OS page cache still holds the data. Sessions are
written as a ~10 KB REPLACE and a few MERGE patches, so a chain stands behind
each head; the sidecar is stopped with SIGTERM and started again on the same
data directory; then each session's latest is read once, in a shuffled order,
each Get followed by an echo of exactly as many bytes as its state.
"""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Iterator
from typing import Any

from ckpt.v1 import service_pb2

from ..sidecar.client import CheckpointClient
from ..sidecar.server import SidecarProcess
from .checkpoint_states import make_patches, make_state
from .echo import ECHO_METHOD
from .echo_sidecar import restart_echo_sidecar, stop_echo_sidecar
from .sidecar_load import STATE_BYTES
from .stats import percentile

COLD_SESSIONS = 200
COLD_SESSIONS_QUICK = 50
MERGES_PER_SESSION = 4
#: Echo calls that open the new server's connection before the reads: a cold read, not a cold channel.
CHANNEL_WARMUP_CALLS = 20


def _cold_session(i: int) -> str:
    return f"bench-cold-{i:04d}"


def write_sessions(target: str, sessions: int) -> None:
    """Each session: a REPLACE of a ~10 KB state, then MERGE patches onto it (one stream, batched)."""
    patches = make_patches(sessions * MERGES_PER_SESSION)

    def puts() -> Iterator[service_pb2.PutRequest]:
        for i in range(sessions):
            yield service_pb2.PutRequest(
                session_id=_cold_session(i), state=make_state(STATE_BYTES, step=i), mode=service_pb2.WRITE_MODE_REPLACE
            )
        for k in range(MERGES_PER_SESSION):
            for i in range(sessions):
                yield service_pb2.PutRequest(
                    session_id=_cold_session(i),
                    state=patches[k * sessions + i],
                    mode=service_pb2.WRITE_MODE_MERGE,
                )

    with CheckpointClient(target) as client:
        for r in client.put_stream(puts(), batch_size=128):
            if r.HasField("error"):
                raise AssertionError(f"writing the cold sessions failed: {r.error}")


def cold_get(sidecar: SidecarProcess, *, quick: bool) -> tuple[SidecarProcess, dict[str, Any]]:
    """Write the sessions, restart the sidecar (SIGTERM, then the same launcher on the same data directory),
    read each session's latest once. Returns the restarted sidecar (the caller stops it) and the reading;
    if the reading fails, the restarted sidecar is stopped here (its log kept) before the error goes on.
    """
    sessions = COLD_SESSIONS_QUICK if quick else COLD_SESSIONS
    write_sessions(sidecar.targets[0], sessions)
    pid_before = sidecar.pid
    restarted = restart_echo_sidecar(sidecar)
    try:
        reading = _read_once(restarted.targets[0], sessions)
    except BaseException:
        stop_echo_sidecar(restarted, ok=False)
        raise
    return restarted, {
        "sessions": sessions,
        "merges_per_session": MERGES_PER_SESSION,
        "pid_before_restart": pid_before,
        "pid_after_restart": restarted.pid,
        **reading,
    }


def _read_once(target: str, sessions: int) -> dict[str, Any]:
    """Each session's latest once, in a shuffled order, each Get followed by an echo of its state's bytes."""
    order = list(range(sessions))
    random.Random(46).shuffle(order)
    get_ns: list[int] = []
    echo_ns: list[int] = []
    state_bytes: list[int] = []
    with CheckpointClient(target) as client:
        # The client's own channel (its options make it a connection of its own, not a plain channel's):
        # the warm-up opens the connection the Gets use, and the echoes travel on it too.
        echo = client._channel.unary_unary(ECHO_METHOD)  # no serializers: bytes in, bytes out
        for _ in range(CHANNEL_WARMUP_CALLS):
            echo(bytes(STATE_BYTES), timeout=30)
        gc.collect()
        gc.disable()
        try:
            for i in order:
                t0 = time.perf_counter_ns()
                got = client.get(_cold_session(i))
                t1 = time.perf_counter_ns()
                payload = bytes(len(got.state))
                t2 = time.perf_counter_ns()
                echo(payload, timeout=30)
                t3 = time.perf_counter_ns()
                if got.version != 1 + MERGES_PER_SESSION:
                    raise AssertionError(f"cold get of {_cold_session(i)} read version {got.version}")
                get_ns.append(t1 - t0)
                echo_ns.append(t3 - t2)
                state_bytes.append(len(got.state))
        finally:
            gc.enable()
    return {
        "state_bytes_median": sorted(state_bytes)[len(state_bytes) // 2],
        "get_p50_us": percentile(get_ns, 50) / 1e3,
        "get_p99_us": percentile(get_ns, 99) / 1e3,
        "echo_p50_us": percentile(echo_ns, 50) / 1e3,
        "echo_p99_us": percentile(echo_ns, 99) / 1e3,
    }
