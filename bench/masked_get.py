"""Masked Get: an agent booting from its handoff note and plan, against a Get of its whole state.

    python -m ckpt.bench.masked_get [--sessions N] [--rounds N] [--hot-reads N] [--json FILE]

The shared trajectories (``bench.trajectories``; ``$CKPT_TRAJECTORIES`` or
--trajectories) are replayed as the ``trajectories`` workload does (messages,
plan steps, tool results), and the ``--sessions`` with the largest final
states are written typed as ``ckpt.v1.Checkpoint``, one MERGE patch per step,
to a real sidecar (its defaults; data under ``$CKPT_BENCH_DIR``, else
``.bench-data/``, removed when done), then a handoff note as the agent pauses.
Each round:

- cold: the sidecar is restarted (its caches empty; the OS page cache still
  holds the data) and each session's latest read once with the mask
  ``handoff,plan``; restarted again, and each read once whole;
- hot: ``--hot-reads`` masked Gets of each session, then as many whole Gets,
  alternating per session.

Figures are medians over rounds (each round's figure of a session: its one cold
read, or the median of its hot reads), time in the client around
``CheckpointClient.get``. The goal: on the largest state, a masked Get at most
0.3x the time of a whole one (cold and hot are both checked). The floor, a hot
Get of a ~300-byte state, is printed beside it: what any Get costs.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpt.v1 import checkpoint_pb2 as pb
from ckpt.v1 import service_pb2

from ..sidecar.client import CheckpointClient
from ..sidecar.server import SidecarProcess
from . import trajectories
from .echo_sidecar import restart_echo_sidecar, start_echo_sidecar, stop_echo_sidecar
from .harness.workloads.replayed import replay_corpus
from .output import finish

MASK = ("handoff", "plan")
GOAL_RATIO = 0.3
CHECKPOINT = "ckpt.v1.Checkpoint"
WARM_SESSION = "masked-warm-up"
FLOOR_SESSION = "masked-floor"
#: Larger than the gRPC process reads itself: a warm-up that reaches the store process and grows the
#: connection's flow-control window, as the largest states' reads need.
WARM_STATE_BYTES = 512 * 1024
DEFAULT_DIR = Path(__file__).resolve().parent.parent / ".bench-data"


@dataclass
class SessionFigures:
    session_id: str
    state_bytes: int
    masked_state_bytes: int
    versions: int
    #: Per round, microseconds.
    cold_masked_us: list[float] = field(default_factory=list)
    cold_full_us: list[float] = field(default_factory=list)
    hot_masked_us: list[float] = field(default_factory=list)
    hot_full_us: list[float] = field(default_factory=list)

    def median(self, name: str) -> float:
        return float(statistics.median(getattr(self, name)))

    def ratio(self, kind: str) -> float:
        return self.median(f"{kind}_masked_us") / self.median(f"{kind}_full_us")


@dataclass
class Report:
    rounds: int
    hot_reads: int
    mask: list[str]
    sessions: list[SessionFigures]
    checks: dict[str, dict[str, Any]]
    #: A hot Get of a ~300-byte state: what any Get costs, however little it carries.
    floor_us: float
    #: That floor against a hot whole Get of the largest state: no masked Get of it can do better.
    floor_vs_full_largest: float


def _handoff(i: int) -> pb.Checkpoint:
    return pb.Checkpoint(
        handoff=pb.Handoff(
            in_progress=f"session {i}: the fix is written, its test not yet run",
            decided="patch the cache key rather than the callers: one place to keep right",
            next="run the failing test, then the whole suite; open the pull request if both pass",
            waiting_on="nothing",
        )
    )


def _largest(count: int, directory: str | None) -> list[list[bytes]]:
    """The MERGE patches of the ``count`` replayed trajectories with the largest final states, largest first."""
    corpus = trajectories.load(directory)
    replayed = replay_corpus(len(corpus), 1_000_000, directory)
    replayed.sort(key=lambda steps: len(steps[-1].state), reverse=True)
    return [[step.patch for step in steps] for steps in replayed[:count]]


def _write(target: str, sessions: list[list[bytes]]) -> list[SessionFigures]:
    def puts() -> Iterator[service_pb2.PutRequest]:
        warm = _handoff(-1)
        warm.messages.add(content="w" * WARM_STATE_BYTES)
        for session, state in ((WARM_SESSION, warm), (FLOOR_SESSION, _handoff(-1))):
            yield service_pb2.PutRequest(session_id=session, state=state.SerializeToString(), message_type=CHECKPOINT)
        for i, patches in enumerate(sessions):
            for patch in [*patches, _handoff(i).SerializeToString()]:
                yield service_pb2.PutRequest(
                    session_id=f"masked-{i}", state=patch, mode=service_pb2.WRITE_MODE_MERGE, message_type=CHECKPOINT
                )

    with CheckpointClient(target) as client:
        for result in client.put_stream(puts()):
            if result.HasField("error"):
                raise RuntimeError(f"writing the sessions failed: {result.error}")
        figures = []
        for i in range(len(sessions)):
            whole = client.get(f"masked-{i}")
            masked = client.get(f"masked-{i}", field_mask=MASK)
            expected = pb.Checkpoint.FromString(whole.state)
            if pb.Checkpoint.FromString(masked.state) != pb.Checkpoint(handoff=expected.handoff, plan=expected.plan):
                raise RuntimeError(f"masked-{i}: the masked Get is not the handoff and plan of the whole state")
            figures.append(SessionFigures(f"masked-{i}", len(whole.state), len(masked.state), whole.version))
    return figures


def _timed_us(client: CheckpointClient, session_id: str, mask: tuple[str, ...]) -> float:
    t0 = time.perf_counter_ns()
    client.get(session_id, field_mask=mask)
    return (time.perf_counter_ns() - t0) / 1e3


def _cold(sidecar: SidecarProcess, figures: list[SessionFigures], mask: tuple[str, ...]) -> SidecarProcess:
    sidecar = restart_echo_sidecar(sidecar)
    with CheckpointClient(sidecar.targets[0]) as client:
        _warm(client)
        for f in figures:
            (f.cold_masked_us if mask else f.cold_full_us).append(_timed_us(client, f.session_id, mask))
    return sidecar


def _warm(client: CheckpointClient) -> None:
    """Open the new server's connection and run both kinds of Get on a large session of their own (both
    processes' first calls and threads, the type's class built, the mask compiled, the connection's
    window grown) before the reads: a cold read, not a cold channel or a cold process."""
    for _ in range(10):
        client.get(WARM_SESSION)
        client.get(WARM_SESSION, field_mask=MASK)


def _hot(target: str, figures: list[SessionFigures], reads: int, floor_us: list[float]) -> None:
    """Each read: a masked Get, a whole Get and a Get of the floor's tiny state, side by side."""
    with CheckpointClient(target) as client:
        floor = []
        for f in figures:
            masked, full = [], []
            for _ in range(reads):
                masked.append(_timed_us(client, f.session_id, MASK))
                full.append(_timed_us(client, f.session_id, ()))
                floor.append(_timed_us(client, FLOOR_SESSION, ()))
            f.hot_masked_us.append(statistics.median(masked))
            f.hot_full_us.append(statistics.median(full))
        floor_us.append(statistics.median(floor))


def run(base: Path, *, sessions: int, rounds: int, hot_reads: int, directory: str | None = None) -> Report:
    patches = _largest(sessions, directory)
    sidecar = start_echo_sidecar(base, f"masked-{os.getpid()}")
    floor_us: list[float] = []
    ok = False
    try:
        figures = _write(sidecar.targets[0], patches)
        gc.collect()
        gc.disable()
        try:
            for _ in range(rounds):
                sidecar = _cold(sidecar, figures, MASK)
                sidecar = _cold(sidecar, figures, ())
                _hot(sidecar.targets[0], figures, hot_reads, floor_us)
        finally:
            gc.enable()
        ok = True
    finally:
        stop_echo_sidecar(sidecar, ok=ok)
    largest = figures[0]
    checks = {
        f"{kind}_masked_vs_full_largest": {
            "value": round(largest.ratio(kind), 3),
            "bound": f"<= {GOAL_RATIO}",
            "ok": largest.ratio(kind) <= GOAL_RATIO,
        }
        for kind in ("cold", "hot")
    }
    floor = float(statistics.median(floor_us))
    return Report(rounds, hot_reads, list(MASK), figures, checks, floor, floor / largest.median("hot_full_us"))


def render(report: Report) -> str:
    lines = [
        f"masked Get of {','.join(report.mask)} against a whole Get, {report.rounds} rounds"
        f" ({report.hot_reads} hot reads each), medians in us",
        f"{'session':<10} {'state B':>9} {'masked B':>9} {'vers':>5} {'cold mask':>10} {'cold full':>10}"
        f" {'ratio':>6} {'hot mask':>9} {'hot full':>9} {'ratio':>6}",
    ]
    for f in report.sessions:
        lines.append(
            f"{f.session_id:<10} {f.state_bytes:>9} {f.masked_state_bytes:>9} {f.versions:>5}"
            f" {f.median('cold_masked_us'):>10.0f} {f.median('cold_full_us'):>10.0f} {f.ratio('cold'):>6.2f}"
            f" {f.median('hot_masked_us'):>9.0f} {f.median('hot_full_us'):>9.0f} {f.ratio('hot'):>6.2f}"
        )
    lines.append(
        f"floor: a hot Get of a {len(_handoff(-1).SerializeToString())}-byte state {report.floor_us:.0f} us,"
        f" {report.floor_vs_full_largest:.2f}x a hot whole Get of the largest state"
    )
    for name, check in report.checks.items():
        lines.append(f"{name}: {check['value']} (goal {check['bound']}) {'ok' if check['ok'] else 'MISSED'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=4, help="the largest trajectories written (default 4)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of cold and hot reads (default 5)")
    parser.add_argument("--hot-reads", type=int, default=50, help="hot Gets of each kind per session and round")
    parser.add_argument("--trajectories", help="the corpus directory (default: $CKPT_TRAJECTORIES, ../shared/...)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    base = Path(os.environ.get("CKPT_BENCH_DIR") or DEFAULT_DIR)
    try:
        report = run(
            base, sessions=args.sessions, rounds=args.rounds, hot_reads=args.hot_reads, directory=args.trajectories
        )
    except (FileNotFoundError, RuntimeError) as exc:
        print(f"masked_get: {exc}", file=sys.stderr)
        return 2
    return finish(report, render(report), args.json)


if __name__ == "__main__":
    sys.exit(main())
