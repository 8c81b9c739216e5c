"""The blob benchmark: run small from its command line against a real sidecar, its data, its echo streams,
and its memory readings."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt.bench import blob_data
from ckpt.bench.blob_data import SeededBlob
from ckpt.bench.echo import SINK_METHOD, SOURCE_METHOD, sink_total, source_request
from ckpt.bench.echo_sidecar import start_echo_sidecar
from ckpt.bench.proc_memory import MemorySampler, memory_status

ROOT = Path(__file__).resolve().parent.parent.parent
MIB = 1024 * 1024


def test_the_blob_bench_puts_and_gets_a_blob_and_reads_back_its_hash(tmp_path: Path) -> None:
    size = 8 * MIB
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "ckpt.bench.blob_bench", "--size-bytes", str(size), "--rounds", "1", "--out", str(out)],
        cwd=ROOT,
        env={**os.environ, "CKPT_BENCH_DIR": str(tmp_path / "data")},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((out / "blob_bench.json").read_text())
    assert report["params"]["size_bytes"] == size and report["params"]["rounds"] == 1
    roles = report["params"]["server_processes"]
    assert set(roles) == {"grpc", "store"} and roles["grpc"] != roles["store"]
    (only,) = report["rounds"]
    # The hash the sidecar answered and the bytes it sent back are those of the blob made from the seed.
    expected = hashlib.sha256(b"".join(SeededBlob(only["seed"], size).blocks())).hexdigest()
    assert only["expected_sha256"] == only["put_sha256"] == only["read_back_sha256"] == expected
    assert report["checks"] == {"sha256": {"ok": True}, "blobs_removed": {"ok": True, "blob_files_left": 0}}
    for leg in ("put", "sink", "get", "source"):
        reading = only["legs"][leg]
        assert reading["seconds"] > 0 and reading["mb_s"] == pytest.approx(size / 1e6 / reading["seconds"])
        memory = reading["memory"]
        assert memory["samples"] >= 1 and set(memory["processes"]) == {"grpc", "store"}
        for role, process in memory["processes"].items():
            assert process["pid"] == roles[role] and process["baseline_rss_bytes"] > 0
            assert process["peak_rss_bytes"] >= process["baseline_rss_bytes"]
            assert process["hwm_after_bytes"] >= process["hwm_before_bytes"] >= process["baseline_rss_bytes"]
        assert memory["peak_growth_bytes"] >= memory["sampled_growth_bytes"] >= 0
    for leg in ("put", "sink"):  # the time after the last chunk is part of the call's
        assert 0 < only["legs"][leg]["after_last_chunk_seconds"] < only["legs"][leg]["seconds"]
        assert report["after_last_chunk_seconds"][leg] == only["legs"][leg]["after_last_chunk_seconds"]
    assert only["put_vs_sink"] == only["legs"]["put"]["mb_s"] / only["legs"]["sink"]["mb_s"]
    assert report["ratios"]["get_vs_source"] == only["get_vs_source"]
    assert set(report["targets"]) == {
        "put_vs_sink",
        "get_vs_source",
        "put_memory_growth_chunks",
        "get_memory_growth_chunks",
    }
    # The printed report says what it measured, and the sidecar's data went with the good run.
    for said in (
        "| median |",
        "from the last byte handed to gRPC",
        "VmRSS",
        "VmHWM",
        "grpc (pid",
        "store (pid",
        "read back by GetBlob, every round: yes",
    ):
        assert said in done.stdout, said
    assert not (tmp_path / "data" / "blob-bench").exists()


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    size=st.integers(0, 40 * 64),
    pieces=st.lists(st.integers(1, 200), min_size=1, max_size=40),
)
def test_a_seeded_blob_reads_the_same_bytes_in_pieces_of_any_size(seed: int, size: int, pieces: list[int]) -> None:
    blob = SeededBlob(seed, size, block_bytes=64)
    whole = b"".join(blob.blocks())
    assert len(whole) == size
    reader = blob.reader()
    assert reader.read(0) == b"" and reader.ended_at is None
    got = []
    for n in pieces * (size // max(1, sum(pieces)) + 2):
        piece = reader.read(n)
        assert len(piece) <= n
        got.append(piece)
    assert b"".join(got) == whole and reader.read(10) == b""
    assert reader.ended_at is not None  # when the last byte was handed over
    assert SeededBlob(seed, size, block_bytes=64).sha256() == hashlib.sha256(whole).hexdigest()


def test_a_seeded_blob_repeats_no_block_and_differs_by_seed() -> None:
    blocks = blob_data.RING_BLOCKS * 2 + 3  # round the ring twice
    blob = list(SeededBlob(1, blocks * 64, block_bytes=64).blocks())
    assert len(set(blob)) == blocks
    other = list(SeededBlob(2, blocks * 64, block_bytes=64).blocks())
    assert not set(blob) & set(other)
    assert blob == list(SeededBlob(1, blocks * 64, block_bytes=64).blocks())
    with pytest.raises(ValueError, match="never held whole"):
        SeededBlob(1, 100).reader().read()


def test_the_echo_sink_counts_a_stream_and_the_source_streams_in_chunks(tmp_path: Path) -> None:
    sidecar = start_echo_sidecar(tmp_path, "streams")
    try:
        with grpc.insecure_channel(sidecar.targets[0]) as channel:
            sink = channel.stream_unary(SINK_METHOD)
            assert sink_total(sink(iter([b"a" * 1000, b"", b"b" * MIB]), timeout=30)) == 1000 + MIB
            assert sink_total(sink(iter([]), timeout=30)) == 0
            source = channel.unary_stream(SOURCE_METHOD)
            sizes = [len(c) for c in source(source_request(2 * MIB + 5, MIB), timeout=30)]
            assert sizes == [MIB, MIB, 5]
            assert list(source(source_request(0, MIB), timeout=30)) == []
            for bad, said in ((b"short", "16 bytes"), (source_request(10, 0), "chunk_bytes must be in 1..")):
                with pytest.raises(grpc.RpcError) as caught:
                    list(source(bad, timeout=30))
                assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert said in (caught.value.details() or "")
    finally:
        assert sidecar.stop() == 0, sidecar.log(tail_chars=2000)


_HOLDER = """
import sys
sys.stdin.readline()
held = bytearray(128 * 1024 * 1024)  # zero-filled: every page touched
print("held", flush=True)
sys.stdin.readline()
"""


def test_the_memory_sampler_sees_a_process_grow() -> None:
    # A child of its own: in this process, freed heap left by earlier tests can take the allocation
    # without a page more becoming resident.
    with subprocess.Popen(
        [sys.executable, "-c", _HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as holder:
        assert holder.stdin is not None and holder.stdout is not None
        with MemorySampler({"holder": holder.pid}, interval_seconds=0.01) as sampler:
            holder.stdin.write("go\n")
            holder.stdin.flush()
            assert holder.stdout.readline() == "held\n"
        holder.stdin.write("done\n")
        holder.stdin.flush()
        assert holder.wait(timeout=30) == 0
    reading = sampler.reading()
    process = reading["processes"]["holder"]
    assert process["peak_growth_bytes"] >= 120 * MIB and reading["sampled_growth_bytes"] >= 120 * MIB
    assert process["peak_anon_bytes"] - process["baseline_anon_bytes"] >= 120 * MIB
    assert reading["peak_growth_bytes"] >= reading["sampled_growth_bytes"]


def test_memory_status_of_a_process_that_is_gone_is_an_os_error() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    with pytest.raises(OSError):
        memory_status(child.pid)
