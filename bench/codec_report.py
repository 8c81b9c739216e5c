"""Codec benchmark: stored bytes, encode time and decode time, side by side in one run.

    python -m ckpt.bench.codec_report [--trajectories DIR] [--quick] [--json FILE]

Workloads: the real agent trajectories (``bench.trajectories``; skipped with a
note when the corpus is absent) and a synthetic in-place-edit agent
(``bench.synthetic``). Every figure is measured in this run on this machine;
times are medians of interleaved repetitions, and targets are checked on
ratios, which survive a noisy shared machine better than absolute times.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ..codec import ChainEncoder, ChainPolicy, EncodedFrame, FrameKind, decode, parse
from ..codec import _zstd as stdzstd
from . import synthetic, trajectories
from .output import finish
from .trajectories import Step

# Targets from issue #2's acceptance.
TARGETS = {
    "merge_bytes_vs_ideal": 1.3,
    "merge_decode_vs_full": 3.0,
    "replace_bytes_vs_ideal": 3.0,
    "replace_decode_vs_full": 4.0,
    "encode_vs_python_zstandard": 0.6,
}


@dataclass
class Workload:
    name: str
    sessions: list[list[Step]]

    @property
    def versions(self) -> int:
        return sum(len(s) for s in self.sessions)


def load_workloads(trajectory_dir: str | None = None) -> tuple[list[Workload], list[str]]:
    notes = []
    loads = []
    try:
        trajs = trajectories.load(trajectory_dir)
        loads.append(Workload("trajectories", [list(trajectories.replay(t)) for t in trajs]))
    except FileNotFoundError as exc:
        notes.append(f"trajectory workload skipped: {exc}")
    loads.append(Workload("synthetic-inplace", synthetic.sessions()))
    return loads, notes


def median_time(fn: Callable[[], object], reps: int) -> float:
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples) / 1e9


def interleaved(a: Callable[[], object], b: Callable[[], object], reps: int) -> tuple[float, float]:
    """Medians of a and b, alternating calls so machine noise hits both alike."""
    ta, tb = [], []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        a()
        t1 = time.perf_counter_ns()
        b()
        t2 = time.perf_counter_ns()
        ta.append(t1 - t0)
        tb.append(t2 - t1)
    return statistics.median(ta) / 1e9, statistics.median(tb) / 1e9


def encode_session(steps: Sequence[Step], mode: str, policy: ChainPolicy) -> list[EncodedFrame]:
    enc = ChainEncoder(policy=policy)
    if mode == "replace":
        return [enc.replace(s.state) for s in steps]
    return [enc.merge(s.patch) for s in steps]


def ideal_bytes(workload: Workload) -> float:
    """Mean zstd -3 size of each step's merge patch alone: the no-history baseline."""
    return statistics.mean(len(stdzstd.zstd.compress(s.patch, level=3)) for ses in workload.sessions for s in ses)


def mean_stored(workload: Workload, mode: str, policy: ChainPolicy) -> float:
    sizes = [f.stored_bytes for ses in workload.sessions for f in encode_session(ses, mode, policy)]
    return statistics.mean(sizes)


@dataclass
class DecodeSample:
    chain_len: int
    state_size: int
    chain_s: float
    full_s: float
    raw_zstd_full_s: float

    @property
    def ratio(self) -> float:
        return self.chain_s / self.full_s


def chains_at_the_bound(frames: list[EncodedFrame]) -> list[list[EncodedFrame]]:
    """Chains the policy ended: each is followed by a FULL frame (the restart)."""
    out, start = [], 0
    for i in range(1, len(frames)):
        if frames[i].kind is FrameKind.FULL:
            out.append(frames[start:i])
            start = i
    return out


def decode_samples(workload: Workload, mode: str, policy: ChainPolicy, reps: int, limit: int) -> list[DecodeSample]:
    """Latest-version decode of every chain ended by the policy, against one FULL frame of that state."""
    samples: list[DecodeSample] = []
    for ses in workload.sessions:
        for chain in chains_at_the_bound(encode_session(ses, mode, policy)):
            if len(chain) < 2:
                continue
            data = [f.data for f in chain]
            state = decode(data)
            full = ChainEncoder(policy=ChainPolicy(max_depth=0, level=policy.level)).replace(state)
            payload = bytes(parse(full.data)[1])
            chain_s, full_s = interleaved(partial(decode, data), partial(decode, [full.data]), reps)
            raw_s = median_time(partial(raw_decompress, payload), reps)
            samples.append(DecodeSample(len(chain), len(state), chain_s, full_s, raw_s))
            if len(samples) >= limit:
                return samples
    return samples


def raw_decompress(payload: bytes) -> bytes:
    """zstd alone, without the codec's header checks: the floor for a FULL decode."""
    return stdzstd.new_reader(window_log=31, prefix=None).decompress(payload)


def summarize(samples: list[DecodeSample]) -> dict[str, float]:
    if not samples:
        return {"n": 0}
    ratios = sorted(s.ratio for s in samples)
    return {
        "n": len(samples),
        "mean_chain_len": statistics.mean(s.chain_len for s in samples),
        "median_state_bytes": statistics.median(s.state_size for s in samples),
        "median_ratio": statistics.median(ratios),
        "p90_ratio": ratios[int(0.9 * (len(ratios) - 1))],
        "max_ratio": ratios[-1],
        "median_chain_us": statistics.median(s.chain_s for s in samples) * 1e6,
        "median_full_us": statistics.median(s.full_s for s in samples) * 1e6,
        "median_vs_raw_zstd": statistics.median(s.chain_s / s.raw_zstd_full_s for s in samples),
    }


def encode_times(workload: Workload, reps: int) -> dict[str, float]:
    """REPLACE delta encoding of the same states: ckpt vs python-zstandard's raw-content dictionary.

    - ckpt (live stream): ChainEncoder.replace over each session, every write a
      DELTA (the steady state of a sidecar: the chain's stream is live);
    - ckpt (stream start): a fresh stdlib compressor with the previous state as
      prefix for every version (the first write after a restart);
    - python-zstandard: ZstdCompressionDict(prev, DICT_TYPE_RAWCONTENT) loaded
      into a level-3 compressor for every version (the only way it can
      reference the previous state).
    """
    import zstandard

    delta_only = ChainPolicy(
        max_depth=1 << 30,
        max_chain_versions=1 << 30,
        max_decode_cost_ratio=1e12,
        max_delta_to_full_ratio=1.0,
        max_materialized_bytes=1 << 62,
    )
    pairs = [(a.state, b.state) for ses in workload.sessions for a, b in itertools.pairwise(ses)]

    def ours_live() -> None:
        for ses in workload.sessions:
            enc = ChainEncoder(policy=delta_only)
            for s in ses:
                enc.replace(s.state)

    def ours_start() -> None:
        for prev, new in pairs:
            # Sized as ChainEncoder sizes a restarted REPLACE stream.
            window_log = max(16, stdzstd.window_log_for(len(prev) + len(new)))
            table_log = stdzstd.table_log_for(max(len(prev), len(new)))
            stream = stdzstd.new_stream(level=3, window_log=window_log, table_log=table_log, prefix=prev)
            stream.compress(new, stdzstd.FLUSH_BLOCK)

    def pz() -> None:
        for ses in workload.sessions:
            zstandard.ZstdCompressor(level=3).compress(ses[0].state)
        for prev, new in pairs:
            d = zstandard.ZstdCompressionDict(prev, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
            zstandard.ZstdCompressor(level=3, dict_data=d).compress(new)

    live, pz_s = interleaved(ours_live, pz, reps)
    start, pz_s2 = interleaved(ours_start, pz, reps)
    n = workload.versions
    return {
        "ckpt_live_us_per_version": live / n * 1e6,
        "ckpt_stream_start_us_per_version": start / n * 1e6,
        "python_zstandard_us_per_version": statistics.median([pz_s, pz_s2]) / n * 1e6,
        "live_vs_python_zstandard": live / pz_s,
        "stream_start_vs_python_zstandard": start / pz_s2,
    }


@dataclass
class Report:
    machine: dict[str, str]
    notes: list[str]
    workloads: dict[str, dict[str, Any]] = field(default_factory=dict)
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)


def run(trajectory_dir: str | None = None, *, quick: bool = False) -> Report:
    reps = 5 if quick else 21
    limit = 20 if quick else 10_000
    loads, notes = load_workloads(trajectory_dir)
    report = Report(
        machine={
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "zstd": stdzstd.zstd.zstd_version,
        },
        notes=notes,
    )
    policy = ChainPolicy()
    for w in loads:
        gc.collect()
        ideal = ideal_bytes(w)
        replace_b = mean_stored(w, "replace", policy)
        merge_b = mean_stored(w, "merge", policy)
        full_b = mean_stored(w, "replace", ChainPolicy(max_depth=0))
        result: dict[str, Any] = {
            "sessions": len(w.sessions),
            "versions": w.versions,
            "mean_state_bytes": statistics.mean(len(s.state) for ses in w.sessions for s in ses),
            "bytes": {
                "ideal": ideal,
                "replace": replace_b,
                "merge": merge_b,
                "full_every_version": full_b,
                "replace_vs_ideal": replace_b / ideal,
                "merge_vs_ideal": merge_b / ideal,
                "full_vs_ideal": full_b / ideal,
            },
            "decode_at_bound": {
                "replace": summarize(decode_samples(w, "replace", policy, reps, limit)),
                "merge": summarize(decode_samples(w, "merge", policy, reps, limit)),
            },
            "encode": encode_times(w, max(3, reps // 3)),
        }
        result["curve"] = tradeoff_curve(w, ideal, quick=quick)
        report.workloads[w.name] = result
    primary = report.workloads.get("trajectories")
    if primary:
        got = {
            "merge_bytes_vs_ideal": primary["bytes"]["merge_vs_ideal"],
            "merge_decode_vs_full": primary["decode_at_bound"]["merge"].get("median_ratio", float("nan")),
            "replace_bytes_vs_ideal": primary["bytes"]["replace_vs_ideal"],
            "replace_decode_vs_full": primary["decode_at_bound"]["replace"].get("median_ratio", float("nan")),
            "encode_vs_python_zstandard": primary["encode"]["live_vs_python_zstandard"],
        }
        report.checks = {k: {"measured": v, "target": TARGETS[k], "ok": v <= TARGETS[k]} for k, v in got.items()}
    return report


def tradeoff_curve(w: Workload, ideal: float, *, quick: bool) -> list[dict[str, Any]]:
    """Bytes per version against decode time at the bound, across policy settings."""
    default = ChainPolicy()
    ratios = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
    settings = [
        (mode, f"max_decode_cost_ratio={r}", ChainPolicy(max_decode_cost_ratio=r))
        for mode in ("replace", "merge")
        for r in ratios
    ]
    rows = []
    for mode, label, policy in settings:
        samples = decode_samples(w, mode, policy, reps=5 if quick else 9, limit=10 if quick else 60)
        s = summarize(samples)
        rows.append(
            {
                "mode": mode,
                "policy": label,
                "default": policy == default,
                "bytes_vs_ideal": mean_stored(w, mode, policy) / ideal,
                "decode_vs_full_median": s.get("median_ratio"),
                "samples": s["n"],
            }
        )
    return rows


def render(report: Report) -> str:
    lines = [f"machine: {report.machine}"]
    lines += [f"note: {n}" for n in report.notes]
    for name, r in report.workloads.items():
        b = r["bytes"]
        lines.append(
            f"\n## {name}: {r['sessions']} sessions, {r['versions']} versions, "
            f"mean state {r['mean_state_bytes']:,.0f} B"
        )
        lines.append("| stored bytes per version | bytes | x ideal |")
        lines.append("|---|---:|---:|")
        lines.append(f"| ideal (zstd -3 of the step's patch alone) | {b['ideal']:,.0f} | 1.00 |")
        lines.append(f"| MERGE (PATCH frames, default policy) | {b['merge']:,.0f} | {b['merge_vs_ideal']:.2f} |")
        lines.append(f"| REPLACE (DELTA frames, default policy) | {b['replace']:,.0f} | {b['replace_vs_ideal']:.2f} |")
        lines.append(f"| FULL frame every version | {b['full_every_version']:,.0f} | {b['full_vs_ideal']:.2f} |")
        lines.append(
            "\n| latest-version decode at the policy's bound | chains | mean len | median state | "
            "chain us | FULL us | median x FULL | p90 x FULL | max x FULL | x raw zstd FULL |"
        )
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for mode, s in r["decode_at_bound"].items():
            if not s["n"]:
                lines.append(f"| {mode} | 0 | (no chain reached the bound) |")
                continue
            lines.append(
                f"| {mode} | {s['n']} | {s['mean_chain_len']:.1f} | {s['median_state_bytes']:,.0f} | "
                f"{s['median_chain_us']:.1f} | {s['median_full_us']:.1f} | {s['median_ratio']:.2f} | "
                f"{s['p90_ratio']:.2f} | {s['max_ratio']:.2f} | {s['median_vs_raw_zstd']:.2f} |"
            )
        e = r["encode"]
        lines.append("\n| REPLACE delta encode, same states | us per version | x python-zstandard |")
        lines.append("|---|---:|---:|")
        lines.append(
            f"| ckpt, live chain stream (steady state) | {e['ckpt_live_us_per_version']:.1f} | "
            f"{e['live_vs_python_zstandard']:.2f} |"
        )
        lines.append(
            f"| ckpt, new stream with prefix (after restart) | {e['ckpt_stream_start_us_per_version']:.1f} | "
            f"{e['stream_start_vs_python_zstandard']:.2f} |"
        )
        lines.append(f"| python-zstandard raw-content dictionary | {e['python_zstandard_us_per_version']:.1f} | 1.00 |")
        lines.append("\n| trade-off: mode | policy | bytes x ideal | decode x FULL (median at bound) | chains |")
        lines.append("|---|---|---:|---:|---:|")
        for row in r["curve"]:
            mark = " (default)" if row["default"] else ""
            dec = "-" if row["decode_vs_full_median"] is None else f"{row['decode_vs_full_median']:.2f}"
            lines.append(
                f"| {row['mode']} | {row['policy']}{mark} | {row['bytes_vs_ideal']:.2f} | {dec} | {row['samples']} |"
            )
    if report.checks:
        lines.append("\n## targets (trajectory workload, default policy)")
        lines.append("| check | measured | target | ok |")
        lines.append("|---|---:|---:|---|")
        for k, c in report.checks.items():
            lines.append(f"| {k} | {c['measured']:.2f} | <= {c['target']} | {'yes' if c['ok'] else 'NO'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--trajectories", help=f"corpus directory (default: ${trajectories.ENV_VAR} or {trajectories.DEFAULT_DIR})"
    )
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and samples")
    parser.add_argument("--json", help="also write the raw results here")
    args = parser.parse_args(argv)
    report = run(args.trajectories, quick=args.quick)
    return finish(report, render(report), args.json)


if __name__ == "__main__":
    sys.exit(main())
