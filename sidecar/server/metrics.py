"""Prometheus metrics for the sidecar (served on an optional HTTP port)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from ..errors import StoreError

if TYPE_CHECKING:
    from ..store import Store

_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)
_DEPTH_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
# How often the /metrics server's loop looks for a stop: what close() waits
# at most (the library's default, 0.5 s, lengthened every sidecar stop).
_STOP_POLL_SECONDS = 0.02


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # every scrape, on stderr
        pass


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("ckpt_requests", "RPCs received", ["rpc"], registry=r)
        self.errors = Counter("ckpt_errors", "RPCs that failed, by status code", ["rpc", "code"], registry=r)
        # A PutStream lives as long as its client likes: its latency is each
        # batch's, from read to answered, not the stream's.
        self.latency = Histogram(
            "ckpt_request_seconds",
            "RPC latency (PutStream: per batch, read to answered)",
            ["rpc"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.bytes_in = Counter("ckpt_received_bytes", "State bytes received in writes", registry=r)
        self.bytes_out = Counter("ckpt_sent_bytes", "State bytes sent in reads", registry=r)
        self.reply_cache_hits = Counter(
            "ckpt_reply_cache_hits",
            "Gets the gRPC process answered from its reply cache, the store process not asked (also counted"
            " as Get requests)",
            registry=r,
        )
        self.read_by_grpc_process = Counter(
            "ckpt_read_by_grpc_process",
            "Calls the gRPC process answered from LMDB itself, the store process not asked: Gets its reply cache"
            " missed and small ReadEvents (also counted as their RPC's requests)",
            ["rpc"],
            registry=r,
        )
        self.stored = Counter("ckpt_stored_bytes", "Frame bytes written to the store", registry=r)
        self.chain_depth = Histogram(
            "ckpt_chain_depth", "Chain depth of each written frame", buckets=_DEPTH_BUCKETS, registry=r
        )

        #: The gRPC process's reply cache (bytes, entries, heads read advancing a kept reader), as it last
        #: reported it; None: it has none.
        self.reply_cache: tuple[int, int, int] | None = None

        # labels() takes a lock and a dict lookup per call: resolve each RPC's
        # children once (RPC names are a fixed set).
        self._per_rpc: dict[str, tuple[Any, Any]] = {}
        self._http: WSGIServer | None = None

    def per_rpc(self, rpc: str) -> tuple[Any, Any]:
        """The request counter and latency histogram of one RPC."""
        children = self._per_rpc.get(rpc)
        if children is None:
            children = self._per_rpc[rpc] = (self.requests.labels(rpc), self.latency.labels(rpc))
        return children

    def watch(self, store: Store) -> None:
        self.registry.register(_StoreCollector(store, self))

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve /metrics on ``addr``:``port`` (0: a free port; an IPv4 or IPv6 address or a
        name) from a daemon thread; the port bound. OSError if it cannot be bound."""
        family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

        class Server(ThreadingWSGIServer):
            address_family = family

        self._http = make_server(addr, port, make_wsgi_app(self.registry), Server, handler_class=_QuietHandler)
        threading.Thread(
            target=self._http.serve_forever,
            kwargs={"poll_interval": _STOP_POLL_SECONDS},
            name="ckpt-metrics",
            daemon=True,
        ).start()
        return int(self._http.server_port)

    def close(self) -> None:
        """Stop serving /metrics (the port is free again)."""
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None


class _StoreCollector(Collector):
    """Store counters read at scrape time (no cost on the write path)."""

    def __init__(self, store: Store, metrics: Metrics) -> None:
        self._store = store
        self._metrics = metrics

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily]:
        s = self._store
        hits = CounterMetricFamily("ckpt_state_cache_hits", "Latest-state cache hits")
        hits.add_metric([], s.counters.cache_hits)
        misses = CounterMetricFamily("ckpt_state_cache_misses", "Latest-state cache misses")
        misses.add_metric([], s.counters.cache_misses)
        commits = CounterMetricFamily("ckpt_commits", "LMDB write transactions committed")
        commits.add_metric([], s.counters.commits)
        sizes = dict(s.counters.batch_sizes)
        buckets, total = [], 0
        for bound in _BATCH_BUCKETS:
            buckets.append((str(bound), sum(n for size, n in sizes.items() if size <= bound)))
        buckets.append(("+Inf", sum(sizes.values())))
        total = sum(size * n for size, n in sizes.items())
        batch = HistogramMetricFamily("ckpt_group_commit_writes", "Writes per group commit")
        batch.add_metric([], buckets, sum_value=total)
        delays = CounterMetricFamily(
            "ckpt_commit_delays", "Commits the writer delayed to wait for the writers it expected"
        )
        delays.add_metric([], s.counters.commit_delays)
        delayed = CounterMetricFamily("ckpt_commit_delay_seconds", "Seconds the writer waited in those delays")
        delayed.add_metric([], s.counters.commit_delay_seconds)
        committing = CounterMetricFamily(
            "ckpt_commit_seconds",
            "Seconds the commits took, LMDB's page writes and syncs (over ckpt_commits_total: a commit's mean)",
        )
        committing.add_metric([], s.counters.commit_seconds)
        memory = GaugeMetricFamily(
            "ckpt_cache_bytes",
            "Memory of the latest-state cache, of cached encoders (estimated) and of the gRPC process's reply cache",
            labels=["cache"],
        )
        for cache, size in s.counters.memory_bytes.items():
            memory.add_metric([cache], size)
        reply_cache = self._metrics.reply_cache
        if reply_cache is not None:
            memory.add_metric(["reply_cache"], reply_cache[0])
            entries = GaugeMetricFamily(
                "ckpt_reply_cache_entries", "Get replies and session head readers the gRPC process keeps"
            )
            entries.add_metric([], reply_cache[1])
            yield entries
            advanced = CounterMetricFamily(
                "ckpt_reply_cache_advanced_reads",
                "Gets of a latest version the gRPC process read by advancing the head it kept of the session with"
                " the frames written since, not decoding the chain whole",
            )
            advanced.add_metric([], reply_cache[2])
            yield advanced
        queued = GaugeMetricFamily(
            "ckpt_queued_write_bytes", "Bytes of states waiting for the writer (max_queued_write_bytes bounds it)"
        )
        queued.add_metric([], s.counters.queued_write_bytes)
        refused = CounterMetricFamily(
            "ckpt_store_full_writes",
            "Writes refused RESOURCE_EXHAUSTED because the store was full (the LMDB map at"
            " max_map_size_bytes, or the disk); nothing was written for them",
        )
        refused.add_metric([], s.counters.store_full_refusals)
        resizes = CounterMetricFamily("ckpt_map_resizes", "Times the LMDB map grew (doubling, up to its cap)")
        resizes.add_metric([], s.counters.map_resizes)
        yield from (hits, misses, commits, batch, delays, delayed, committing, memory, queued, refused, resizes)
        yield from _sweeps(s)
        yield from _space(s)


def _sweeps(store: Store) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
    """What the background sweeper did (only the process that sweeps: one worker's with --workers)."""
    swept = store.counters.swept
    for name, doc, value in (
        ("ckpt_sweeps", "Retention sweeps completed (--sweep-interval-seconds apart)", store.counters.sweeps),
        ("ckpt_sweep_versions_removed", "Versions the sweeps removed by retention", swept.versions_removed),
        ("ckpt_sweep_request_ids_expired", "Request ids the sweeps freed past their TTL", swept.request_ids_expired),
        (
            "ckpt_sweep_keyframes_written",
            "Quiet sessions' heads the sweeps rewrote as FULL frames",
            swept.keyframes_written,
        ),
        (
            "ckpt_sweep_blob_refs_released",
            "Blob references the sweeps dropped (named by no version kept, or of a session without a checkpoint)",
            swept.blob_refs_released,
        ),
        (
            "ckpt_sweep_heads_folded",
            "Quiet sessions' head runs the sweeps folded (a FULL head, PREFIX frames before it)",
            swept.heads_folded,
        ),
    ):
        counter = CounterMetricFamily(name, doc)
        counter.add_metric([], value)
        yield counter
    if store.counters.last_sweep_unix_seconds is not None:
        last = GaugeMetricFamily(
            "ckpt_last_sweep_timestamp_seconds", "When the last sweep ended (Unix time): alert if it falls behind"
        )
        last.add_metric([], store.counters.last_sweep_unix_seconds)
        yield last


def _space(store: Store) -> Iterator[GaugeMetricFamily]:
    """How full the store is, from one read snapshot (nothing while it is closed)."""
    try:
        stats = store.stats()
    except StoreError:
        return
    for name, doc, value in (
        ("ckpt_sessions", "Sessions holding a checkpoint (with events alone: ckpt_event_logs)", stats["sessions"]),
        ("ckpt_event_logs", "Sessions holding an event log", stats["event_logs"]),
        ("ckpt_versions", "Versions stored, over all sessions", stats["versions"]),
        (
            "ckpt_store_used_bytes",
            "Bytes of the LMDB data file up to its last page in use (pages freed inside it are reused first);"
            " writes fail RESOURCE_EXHAUSTED once it would pass ckpt_store_max_map_size_bytes",
            stats["used_bytes"],
        ),
        ("ckpt_store_map_size_bytes", "The LMDB map's current size (it doubles when full)", stats["map_size_bytes"]),
        (
            "ckpt_store_max_map_size_bytes",
            "The map's cap (ckpt serve --max-map-size-bytes): the store is full when used bytes reach it",
            store.config.max_map_size_bytes,
        ),
    ):
        gauge = GaugeMetricFamily(name, doc)
        gauge.add_metric([], value)
        yield gauge
