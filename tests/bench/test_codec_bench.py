"""Codec benchmarks (opt-in: `make bench`, or pytest -m benchmark tests/bench/).

Side by side in one run, on the ~300 KB state of a real trajectory:
- decode of the latest version at the default policy's longest chain,
  against one FULL-frame decode of the same state;
- REPLACE delta encode, against python-zstandard's raw-content dictionary.
Then the whole-workload report (bench.codec_report), whose targets fail the
run when missed.
"""

from __future__ import annotations

import itertools

import pytest

from ckpt.bench import codec_report, trajectories
from ckpt.codec import ChainEncoder, ChainPolicy, FrameKind, decode

pytestmark = pytest.mark.benchmark

DELTA_ONLY = ChainPolicy(max_depth=1 << 20, max_decode_cost_ratio=1e12, max_delta_to_full_ratio=1.0)


@pytest.fixture(scope="module")
def big_session(trajectory_dir):
    """The steps of the trajectory whose final state is closest to 300 KB."""
    sessions = [list(trajectories.replay(t)) for t in trajectories.load(trajectory_dir)]
    return min(sessions, key=lambda s: abs(len(s[-1].state) - 300_000))


def longest_chain(steps, mode: str) -> list[bytes]:
    """The last chain the default policy lets grow to its bound (or the last chain)."""
    enc = ChainEncoder()
    chains: list[list[bytes]] = []
    for step in steps:
        frame = enc.replace(step.state) if mode == "replace" else enc.merge(step.patch)
        if frame.kind is FrameKind.FULL:
            chains.append([])
        chains[-1].append(frame.data)
    return max(chains, key=len)


@pytest.mark.parametrize("mode", ["replace", "merge"])
def test_decode_latest_at_longest_chain(benchmark, big_session, mode: str) -> None:
    chain = longest_chain(big_session, mode)
    benchmark.group = f"decode {mode}"
    benchmark.extra_info["chain_frames"] = len(chain)
    state = benchmark(decode, chain)
    benchmark.extra_info["state_bytes"] = len(state)


@pytest.mark.parametrize("mode", ["replace", "merge"])
def test_decode_one_full_frame_of_the_same_state(benchmark, big_session, mode: str) -> None:
    state = decode(longest_chain(big_session, mode))
    full = ChainEncoder(policy=ChainPolicy(max_depth=0)).replace(state).data
    benchmark.group = f"decode {mode}"
    assert benchmark(decode, [full]) == state


def test_encode_replace_ckpt_live_stream(benchmark, big_session) -> None:
    states = [s.state for s in big_session]

    def encode_all() -> None:
        enc = ChainEncoder(policy=DELTA_ONLY)
        for s in states:
            enc.replace(s)

    benchmark.group = "encode replace (whole session)"
    benchmark(encode_all)


def test_encode_replace_python_zstandard_raw_dict(benchmark, big_session) -> None:
    import zstandard

    states = [s.state for s in big_session]

    def encode_all() -> None:
        zstandard.ZstdCompressor(level=3).compress(states[0])
        for prev, new in itertools.pairwise(states):
            d = zstandard.ZstdCompressionDict(prev, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
            zstandard.ZstdCompressor(level=3, dict_data=d).compress(new)

    benchmark.group = "encode replace (whole session)"
    benchmark(encode_all)


def test_workload_report_meets_targets(trajectory_dir) -> None:
    report = codec_report.run(trajectory_dir)
    print("\n" + codec_report.render(report))
    missed = {k: c for k, c in report.checks.items() if not c["ok"]}
    assert report.checks and not missed, f"targets missed: {missed}"
