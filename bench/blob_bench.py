"""Blob benchmark: a blob in and out through a real sidecar, against an echo stream of the same bytes.

    python -m ckpt.bench.blob_bench [--size-bytes N] [--rounds R] [--out DIR]

One sidecar (``bench.echo_sidecar``: ``ckpt serve`` on its defaults, fsync on,
serving the echo methods too) on a unix socket, its data directory under
``$CKPT_BENCH_DIR``, else ``.bench-data/`` at the repository root; removed
when done. Each round stores a new blob of N bytes (default 1 GiB) made as it
is sent from a seed of its own (bench/blob_data.py: never whole in memory, no
two blocks alike, so no upload is answered by deduplication), and times, the
order of each pair alternating round by round:

- PutBlob: ``CheckpointClient.put_blob`` of the blob in 1 MiB chunks, from the
  first message to the answer (the file flushed, its record committed);
- Sink: the same bytes, made the same way, in the same chunks, to the echo's
  client stream, which reads and drops them (bench/echo.py): gRPC alone;
- GetBlob: ``CheckpointClient.get_blob`` of the blob just stored, every chunk
  (1 MiB messages) taken and counted; the file was just written, so it is
  read from the page cache, as a blob fetched soon after its upload is;
- Source: as many bytes from the echo's server stream, in messages of
  GetBlob's size, taken and counted the same way: gRPC alone.

MB/s (10^6 bytes a second) of each; put/sink and get/source per round, and
their medians. While each call runs, VmRSS of both sidecar processes (the gRPC
process, which streams a blob's bytes, and its store process, which records
it) is read every 50 ms; the growth is over their VmRSS read just before the
call (the server idle), counting VmHWM where it rose (a peak between two
samples), against twice the chunk size. A warm-up blob of the same size, up to
64 MiB, goes through all four calls first: on a server's first long stream
gRPC's flow-control window grows and its buffers with it (a grpc.aio server
that drops what it reads grew ~15 MiB over a first 64 MiB stream here), and
the heap keeps what a call freed for the next; the baseline is that of a
server that has served blobs. Untimed, each round checks the blob's SHA-256
three ways (made here, answered by PutBlob, read back by GetBlob), then
deletes its session, which removes the blob, so the disk holds one blob at a
time. Targets (issue 47: each ratio >= 0.5, the growth under 2x the chunk)
are reported, not checked: the run fails only on a wrong hash or a blob left
behind.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, cast

import grpc

from ..sidecar.client import CheckpointClient
from ..sidecar.client.blobs import DEFAULT_BLOB_CHUNK_BYTES, blob_sha256
from ..sidecar.client.channel import channel_options
from ..sidecar.config import DEFAULT_MAX_MESSAGE_BYTES
from ..sidecar.server import SidecarProcess
from ..sidecar.server.blobstreams import BLOB_CHUNK_BYTES
from .blob_data import BlobReader, SeededBlob
from .echo import SINK_METHOD, SOURCE_METHOD, sink_total, source_request
from .echo_sidecar import start_echo_sidecar, stop_echo_sidecar
from .output import finish, process_and_children
from .proc_memory import SAMPLE_SECONDS, MemorySampler
from .sidecar_bench import data_root, machine_info

DEFAULT_SIZE_BYTES = 1024**3
DEFAULT_ROUNDS = 3
#: The warm-up blob's size at most (a smaller blob warms up with its own size).
WARMUP_BYTES = 64 * 1024 * 1024
#: PutBlob's chunk (the clients' default) and GetBlob's (the server's); the sink and source use the same.
PUT_CHUNK_BYTES = DEFAULT_BLOB_CHUNK_BYTES
GET_CHUNK_BYTES = BLOB_CHUNK_BYTES
#: Issue 47's "Measured" line: (comparison, bound); the memory bound is in chunks.
TARGETS: dict[str, tuple[str, float]] = {
    "put_vs_sink": (">=", 0.5),
    "get_vs_source": (">=", 0.5),
    "put_memory_growth_chunks": ("<", 2.0),
    "get_memory_growth_chunks": ("<", 2.0),
}
#: Free space the data directory's file system must have, beyond the blob itself.
DISK_MARGIN_BYTES = 512 * 1024 * 1024
_FIRST_SEED = 47_000


@dataclass
class Report:
    machine: dict[str, Any]
    params: dict[str, Any]
    rounds: list[dict[str, Any]] = field(default_factory=list)
    rates_mb_s: dict[str, float] = field(default_factory=dict)
    ratios: dict[str, float] = field(default_factory=dict)
    #: Medians: from the last byte handed to gRPC to the answer, for put and sink.
    after_last_chunk_seconds: dict[str, float] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)
    targets: dict[str, dict[str, Any]] = field(default_factory=dict)
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)


def server_roles(sidecar: SidecarProcess) -> dict[str, int]:
    """The sidecar's processes by role: the gRPC process, its store process (and any other child)."""
    roles = {"grpc": sidecar.pid}
    for pid in process_and_children(sidecar.pid)[1:]:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        roles["store" if b"storehost" in cmdline and "store" not in roles else f"child-{pid}"] = pid
    if "store" not in roles:
        raise RuntimeError(f"sidecar {sidecar.pid} has no store process among {roles}")
    return roles


class BlobCalls:
    """The four timed calls against one sidecar, each with the server's memory sampled while it runs."""

    def __init__(self, sidecar: SidecarProcess) -> None:
        target = sidecar.targets[0]
        self.roles = server_roles(sidecar)
        self.client = CheckpointClient(target)
        # The client's own channel options, so the echo's connection is set up as the blob calls' is.
        self._channel = grpc.insecure_channel(target, options=channel_options(DEFAULT_MAX_MESSAGE_BYTES))
        self._sink = self._channel.stream_unary(SINK_METHOD)
        self._source = self._channel.unary_stream(SOURCE_METHOD)

    def close(self) -> None:
        self.client.close()
        self._channel.close()

    def timed(self, call: Callable[[], Any]) -> tuple[Any, dict[str, Any]]:
        """``call()``'s result, and its seconds and the server's memory meanwhile."""
        with MemorySampler(self.roles) as memory:
            t0 = time.perf_counter()
            result = call()
            seconds = time.perf_counter() - t0
        return result, {"seconds": seconds, "memory": memory.reading()}

    def put(self, blob: SeededBlob, session_id: str) -> tuple[str, float]:
        """Store ``blob``: its SHA-256 as answered, and the seconds from its last byte handed to gRPC to the answer."""
        reader = blob.reader()
        # put_blob reads a file object by read(n) alone, which the reader has.
        ref = self.client.put_blob(
            cast(BinaryIO, reader),
            session_id=session_id,
            media_type="application/octet-stream",
            chunk_size_bytes=PUT_CHUNK_BYTES,
        )
        answered = time.perf_counter()
        _expect_size("PutBlob answered", ref.size_bytes, blob.size_bytes)
        return blob_sha256(ref), _after_last_chunk(reader, answered)

    def sink(self, blob: SeededBlob) -> tuple[None, float]:
        """Send ``blob`` to the sink; the seconds from its last byte handed to gRPC to the answer."""
        reader = blob.reader()
        chunks: Iterator[bytes] = iter(lambda: reader.read(PUT_CHUNK_BYTES), b"")
        total = sink_total(self._sink(chunks))
        answered = time.perf_counter()
        _expect_size("the sink counted", total, blob.size_bytes)
        return None, _after_last_chunk(reader, answered)

    def get(self, sha256: str, size_bytes: int) -> None:
        _expect_size("GetBlob sent", sum(len(c) for c in self.client.get_blob(sha256)), size_bytes)

    def source(self, size_bytes: int) -> None:
        sent = self._source(source_request(size_bytes, GET_CHUNK_BYTES))
        _expect_size("the source sent", sum(len(c) for c in sent), size_bytes)

    def read_back_sha256(self, sha256: str) -> str:
        digest = hashlib.sha256()
        for chunk in self.client.get_blob(sha256):
            digest.update(chunk)
        return digest.hexdigest()


def _after_last_chunk(reader: BlobReader, answered: float) -> float:
    if reader.ended_at is None:
        raise AssertionError("the call was answered before its blob was read to the end")
    return answered - reader.ended_at


def _expect_size(what: str, got: int, want: int) -> None:
    if got != want:
        raise AssertionError(f"{what} {got} bytes, not {want}")


def _mb_s(size_bytes: int, seconds: float) -> float:
    return size_bytes / 1e6 / seconds


def one_round(calls: BlobCalls, index: int, size_bytes: int) -> dict[str, Any]:
    """Round ``index``: a new blob put and sunk, then got and sourced, each pair in the round's order;
    its hash checked; its session deleted (the blob with it)."""
    seed = _FIRST_SEED + index
    blob = SeededBlob(seed, size_bytes)
    session_id = f"bench-blob-{index}"
    blob_first = index % 2 == 0
    legs: dict[str, dict[str, Any]] = {}
    put_pair: list[tuple[str, Callable[[], Any]]] = [
        ("put", lambda: calls.put(blob, session_id)),
        ("sink", lambda: calls.sink(blob)),
    ]
    stored = ""
    for name, call in put_pair if blob_first else put_pair[::-1]:
        (sha256, tail), legs[name] = calls.timed(call)
        legs[name]["after_last_chunk_seconds"] = tail
        stored = sha256 or stored
    get_pair: list[tuple[str, Callable[[], Any]]] = [
        ("get", lambda: calls.get(stored, size_bytes)),
        ("source", lambda: calls.source(size_bytes)),
    ]
    for name, call in get_pair if blob_first else get_pair[::-1]:
        _, legs[name] = calls.timed(call)
    for leg in legs.values():
        leg["mb_s"] = _mb_s(size_bytes, leg["seconds"])
    expected = blob.sha256()
    read_back = calls.read_back_sha256(stored)
    calls.client.delete(session_id)
    return {
        "round": index,
        "seed": seed,
        "order": "blob first" if blob_first else "echo first",
        "expected_sha256": expected,
        "put_sha256": stored,
        "read_back_sha256": read_back,
        "legs": legs,
        "put_vs_sink": legs["put"]["mb_s"] / legs["sink"]["mb_s"],
        "get_vs_source": legs["get"]["mb_s"] / legs["source"]["mb_s"],
    }


def warm_up(calls: BlobCalls, size_bytes: int) -> None:
    """A blob of ``size_bytes`` through all four calls, untimed: the server's threads, buffers and flow-control
    windows as they are once it has served blob streams, before any baseline is read."""
    blob = SeededBlob(_FIRST_SEED - 1, size_bytes)
    stored, _ = calls.put(blob, "bench-blob-warm-up")
    calls.sink(blob)
    calls.get(stored, size_bytes)
    calls.source(size_bytes)
    calls.client.delete("bench-blob-warm-up")


def blob_files(data_dir: Path) -> int:
    """How many blob files the data directory holds (bytes moved into place, not temporary files)."""
    root = data_dir / "blobs" / "sha256"
    return sum(1 for p in root.rglob("*") if p.is_file()) if root.is_dir() else 0


def run(*, size_bytes: int = DEFAULT_SIZE_BYTES, rounds: int = DEFAULT_ROUNDS, root: Path | None = None) -> Report:
    base = root or data_root()
    base.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(base).free
    if free < size_bytes + DISK_MARGIN_BYTES:
        raise SystemExit(
            f"{base} has {free:,} bytes free; a {size_bytes:,}-byte blob needs {size_bytes + DISK_MARGIN_BYTES:,}"
            f" (the blob and {DISK_MARGIN_BYTES:,} to spare): set $CKPT_BENCH_DIR elsewhere or lower --size-bytes"
        )
    sidecar = start_echo_sidecar(base, "blob-bench")
    ok = False
    try:
        calls = BlobCalls(sidecar)
        try:
            report = Report(
                machine={**machine_info(), "data_dir": str(sidecar.data_dir), "target": sidecar.targets[0]},
                params={
                    "size_bytes": size_bytes,
                    "rounds": rounds,
                    "put_chunk_bytes": PUT_CHUNK_BYTES,
                    "get_chunk_bytes": GET_CHUNK_BYTES,
                    "warmup_bytes": min(size_bytes, WARMUP_BYTES),
                    "memory_sample_seconds": SAMPLE_SECONDS,
                    "server_processes": calls.roles,
                    "durability": "sync (default)",
                },
            )
            warm_up(calls, min(size_bytes, WARMUP_BYTES))
            for index in range(rounds):
                report.rounds.append(one_round(calls, index, size_bytes))
        finally:
            calls.close()
        summarize(report)
        report.checks["sha256"] = {
            "ok": all(r["expected_sha256"] == r["put_sha256"] == r["read_back_sha256"] for r in report.rounds)
        }
        left = blob_files(sidecar.data_dir)
        report.checks["blobs_removed"] = {"ok": left == 0, "blob_files_left": left}
        ok = True
        return report
    finally:
        stop_echo_sidecar(sidecar, ok=ok)


def summarize(report: Report) -> None:
    """Medians over the rounds, the memory's worst, and each target's reading."""
    rounds = report.rounds
    for leg in ("put", "sink", "get", "source"):
        report.rates_mb_s[leg] = statistics.median(r["legs"][leg]["mb_s"] for r in rounds)
    for ratio in ("put_vs_sink", "get_vs_source"):
        report.ratios[ratio] = statistics.median(r[ratio] for r in rounds)
    for leg in ("put", "sink"):
        report.after_last_chunk_seconds[leg] = statistics.median(
            r["legs"][leg]["after_last_chunk_seconds"] for r in rounds
        )
    chunk = {"put": PUT_CHUNK_BYTES, "sink": PUT_CHUNK_BYTES, "get": GET_CHUNK_BYTES, "source": GET_CHUNK_BYTES}
    for leg, chunk_bytes in chunk.items():
        growths = [r["legs"][leg]["memory"]["peak_growth_bytes"] for r in rounds]
        sampled = [r["legs"][leg]["memory"]["sampled_growth_bytes"] for r in rounds]
        report.memory[leg] = {
            "peak_growth_bytes_max": max(growths),
            "peak_growth_bytes_median": statistics.median(growths),
            "sampled_growth_bytes_max": max(sampled),
            "peak_growth_chunks_max": max(growths) / chunk_bytes,
        }
    got = {
        "put_vs_sink": report.ratios["put_vs_sink"],
        "get_vs_source": report.ratios["get_vs_source"],
        "put_memory_growth_chunks": report.memory["put"]["peak_growth_chunks_max"],
        "get_memory_growth_chunks": report.memory["get"]["peak_growth_chunks_max"],
    }
    for name, value in got.items():
        op, bound = TARGETS[name]
        report.targets[name] = {"measured": value, "op": op, "target": bound, "met": _meets(value, op, bound)}


def _meets(value: float, op: str, bound: float) -> bool:
    return value >= bound if op == ">=" else value < bound


def _mib(n: float) -> str:
    return f"{n / 1024**2:+.1f} MiB"


def render(report: Report) -> str:
    p = report.params
    lines = [
        f"machine: {report.machine}",
        f"params: {p}",
        "",
        f"## a {p['size_bytes']:,}-byte blob in and out through the sidecar, against an echo stream of the same"
        f" bytes ({p['rounds']} rounds; MB = 10^6 bytes)",
        "put: CheckpointClient.put_blob, first message to the answer (file flushed, record committed); sink: the"
        " same bytes and chunks to an echo that drops them. get: CheckpointClient.get_blob of the blob just"
        " stored (from the page cache); source: as many bytes from an echo in GetBlob's message size.",
        "",
        "| round | order | put MB/s | sink MB/s | put/sink | get MB/s | source MB/s | get/source |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report.rounds:
        legs = r["legs"]
        lines.append(
            f"| {r['round']} | {r['order']} | {legs['put']['mb_s']:,.0f} | {legs['sink']['mb_s']:,.0f} |"
            f" {r['put_vs_sink']:.2f} | {legs['get']['mb_s']:,.0f} | {legs['source']['mb_s']:,.0f} |"
            f" {r['get_vs_source']:.2f} |"
        )
    rates, ratios = report.rates_mb_s, report.ratios
    lines.append(
        f"| median | | {rates['put']:,.0f} | {rates['sink']:,.0f} | {ratios['put_vs_sink']:.2f} | {rates['get']:,.0f}"
        f" | {rates['source']:,.0f} | {ratios['get_vs_source']:.2f} |"
    )
    tails = report.after_last_chunk_seconds
    lines.append(
        f"\nfrom the last byte handed to gRPC to the answer (median): put {tails['put'] * 1000:,.1f} ms (the server"
        f" taking what was still in flight, flushing the file, committing the record), sink {tails['sink'] * 1000:,.1f}"
        " ms (what was still in flight)"
    )
    roles = " and ".join(f"{role} (pid {pid})" for role, pid in p["server_processes"].items())
    lines += [
        "",
        f"## the sidecar's memory during each call: VmRSS of {roles}, read every"
        f" {p['memory_sample_seconds'] * 1000:.0f} ms",
        "growth: each process's highest VmRSS during the call (sampled, or VmHWM where it rose: a peak between"
        " samples) over its VmRSS just before the call (idle), summed over the processes; sampled: the highest"
        " sum read at one moment, over the idle sum. The sink and source rows are gRPC's own, for comparison.",
        "",
        "| call | growth, worst round | growth, median | sampled, worst | worst in chunks |",
        "|---|---:|---:|---:|---:|",
    ]
    for leg, m in report.memory.items():
        lines.append(
            f"| {leg} | {_mib(m['peak_growth_bytes_max'])} | {_mib(m['peak_growth_bytes_median'])} |"
            f" {_mib(m['sampled_growth_bytes_max'])} | {m['peak_growth_chunks_max']:.2f} |"
        )
    lines += ["", "per process, each round (baseline -> highest VmRSS, RssAnon; VmHWM before -> after):"]
    for r in report.rounds:
        for leg in ("put", "get"):
            for role, m in r["legs"][leg]["memory"]["processes"].items():
                lines.append(
                    f"  round {r['round']} {leg} {role}: VmRSS {m['baseline_rss_bytes'] / 1024**2:.1f} ->"
                    f" {m['peak_rss_bytes'] / 1024**2:.1f} MiB, RssAnon {m['baseline_anon_bytes'] / 1024**2:.1f} ->"
                    f" {m['peak_anon_bytes'] / 1024**2:.1f} MiB, VmHWM {m['hwm_before_bytes'] / 1024**2:.1f} ->"
                    f" {m['hwm_after_bytes'] / 1024**2:.1f} MiB"
                )
    lines += [
        "",
        "## targets (issue 47; reported, not checked)",
        "| reading | value | target | met |",
        "|---|---:|---:|---|",
    ]
    for name, t in report.targets.items():
        lines.append(f"| {name} | {t['measured']:.2f} | {t['op']} {t['target']} | {'yes' if t['met'] else 'NO'} |")
    sha = report.checks["sha256"]
    left = report.checks["blobs_removed"]["blob_files_left"]
    last = report.rounds[-1]
    lines += [
        "",
        f"sha256 made here = answered by PutBlob = read back by GetBlob, every round: {'yes' if sha['ok'] else 'NO'}"
        f" (last: {last['read_back_sha256']}); blob files left after deleting the sessions: {left}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-bytes", type=int, default=DEFAULT_SIZE_BYTES, help="the blob's size (default 1 GiB)")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help=f"rounds (default {DEFAULT_ROUNDS})")
    parser.add_argument("--out", type=Path, help="also write the results here, as blob_bench.json")
    args = parser.parse_args(argv)
    if args.size_bytes < 1:
        parser.error(f"--size-bytes must be >= 1, got {args.size_bytes}")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    report = run(size_bytes=args.size_bytes, rounds=args.rounds)
    json_path = None
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        json_path = str(args.out / "blob_bench.json")
    return finish(report, render(report), json_path)


if __name__ == "__main__":
    sys.exit(main())
